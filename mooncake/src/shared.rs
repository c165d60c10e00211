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
        }))
    }
}
