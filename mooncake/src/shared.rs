//! The engine state that every object made from an engine shares.
//!
//! It sits below `memory`, `segment`, `batch` and `config` so that they can
//! hold the engine alive without knowing the [`Engine`](crate::Engine) type
//! that ties them together.
use std::sync::Arc;

use crate::error::Result;
use crate::ffi::RawEngine;

/// State shared by an engine and every object made from it. Children hold
/// an `Arc` of it (registered regions an `Arc` of its handle), so the engine
/// is destroyed only after the last registration, segment and batch is gone.
pub(crate) struct EngineShared {
    pub(crate) raw: Arc<RawEngine>,
    pub(crate) segment_name: String,
    pub(crate) rpc_port: u16,
    pub(crate) tcp_data_port: u16,
    /// Why [`Protocol::Auto`](crate::Protocol::Auto) fell back to TCP.
    pub(crate) rdma_unavailable: Option<String>,
    /// The async reactor, started by the first async use.
    #[cfg(feature = "async")]
    reactor: std::sync::OnceLock<crate::reactor::Reactor>,
    #[cfg(feature = "async")]
    reactor_start: std::sync::Mutex<()>,
}

impl EngineShared {
    pub(crate) fn new(raw: RawEngine, rdma_unavailable: Option<String>) -> Result<Arc<Self>> {
        let segment_name = raw.segment_name()?;
        let (rpc_port, tcp_data_port) = raw.ports()?;
        Ok(Arc::new(Self {
            raw: Arc::new(raw),
            segment_name,
            rpc_port,
            tcp_data_port,
            rdma_unavailable,
            #[cfg(feature = "async")]
            reactor: std::sync::OnceLock::new(),
            #[cfg(feature = "async")]
            reactor_start: std::sync::Mutex::new(()),
        }))
    }

    /// The engine's async reactor, started on first use.
    #[cfg(feature = "async")]
    pub(crate) fn reactor(&self) -> Result<&crate::reactor::Reactor> {
        if let Some(r) = self.reactor.get() {
            return Ok(r);
        }
        let _one_at_a_time = self.reactor_start.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = self.reactor.get() {
            return Ok(r);
        }
        let r = crate::reactor::Reactor::start(&self.raw)?;
        Ok(self.reactor.get_or_init(|| r))
    }
}
