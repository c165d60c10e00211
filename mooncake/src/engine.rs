//! The engine handle.
use std::sync::Arc;

use crate::batch::Batch;
use crate::config::{EngineBuilder, GpuRegistration};
use crate::error::Result;
use crate::ffi;
use crate::memory::{Access, ManagedBuffer, RegisterableMemory, RegisteredSlice, Registration};
use crate::notify::Notification;
use crate::rdma::{NicLoad, RdmaCounters, RdmaTopology};
use crate::segment::RemoteSegment;
use crate::shared::EngineShared;

/// A transfer engine: it owns one local segment (the memory registered with
/// it, served to peers) and initiates transfers to remote segments.
///
/// `Engine` is `Send + Sync` and cheap to clone (an `Arc`): the engine
/// behind it is built for concurrent use, every C entry point being
/// internally synchronised, so any number of threads may register memory,
/// submit and wait at once.
#[derive(Clone)]
pub struct Engine {
    pub(crate) shared: Arc<EngineShared>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("segment_name", &self.shared.segment_name)
            .finish()
    }
}

impl Engine {
    /// A builder with upstream's defaults.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    fn from_shared(shared: Arc<EngineShared>) -> Self {
        tracing::debug!(target: "mooncake", segment = %shared.segment_name, "engine started");
        Self { shared }
    }

    /// This engine's segment name, `"<host>:<handshake port>"`: what peers
    /// pass to `open_segment`.
    pub fn segment_name(&self) -> &str {
        &self.shared.segment_name
    }

    /// The handshake (RPC) port.
    pub fn rpc_port(&self) -> u16 {
        self.shared.rpc_port
    }

    /// The TCP data port.
    pub fn tcp_data_port(&self) -> u16 {
        self.shared.tcp_data_port
    }

    /// The GPU registration mode in force ([`GpuRegistration::FromEnv`] is
    /// resolved when the engine starts).
    pub fn gpu_registration(&self) -> Result<GpuRegistration> {
        Ok(GpuRegistration::from_raw(
            self.shared.raw.gpu_registration_mode()?,
        ))
    }

    /// The RDMA device allow-list and deny-list in force.
    pub fn device_filters(&self) -> Result<(Vec<String>, Vec<String>)> {
        let (a, d) = self.shared.raw.device_filters()?;
        let split = |s: String| {
            s.split(',')
                .filter(|x| !x.is_empty())
                .map(str::to_string)
                .collect()
        };
        Ok((split(a), split(d)))
    }

    /// The engine's version string.
    pub fn version() -> &'static str {
        ffi::engine_version()
    }

    /// Registers memory that the registration then owns; dropping the
    /// registration unregisters it (waiting for in-flight transfers) before
    /// the memory is freed. `location` is a topology hint such as `"cpu:0"`;
    /// `"*"` detects it.
    pub fn register<M: RegisterableMemory>(
        &self,
        memory: M,
        location: &str,
        access: Access,
    ) -> Result<Registration<M>> {
        Registration::new(self.shared.clone(), memory, location, access)
    }

    /// Registers several memories with one engine call (upstream's
    /// `registerLocalMemoryBatch`: one descriptor update; all or none are
    /// registered). They are remote-accessible, as upstream's batch call
    /// makes them.
    pub fn register_batch<M: RegisterableMemory>(
        &self,
        memories: Vec<M>,
        location: &str,
    ) -> Result<Vec<Registration<M>>> {
        Registration::new_batch(self.shared.clone(), memories, location)
    }

    /// A buffer of `len` bytes that the engine allocates and registers
    /// (upstream's managed buffer); freed when dropped.
    pub fn alloc_managed(&self, len: usize, location: &str) -> Result<ManagedBuffer> {
        ManagedBuffer::new(self.shared.clone(), len, location)
    }

    /// Graceful shutdown, as upstream's `enableGracefulShutdown`: when the
    /// engine is finally dropped, it first waits for every batch still in
    /// flight (bounded by the TCP progress timeout) instead of failing it.
    pub fn enable_graceful_shutdown(&self) {
        self.shared.raw.enable_graceful_shutdown();
        tracing::debug!(target: "mooncake", "graceful shutdown enabled");
    }

    /// Per-NIC load of the RDMA transport (upstream's `getNicLoadStats`);
    /// empty without RDMA.
    pub fn nic_load(&self) -> Result<Vec<NicLoad>> {
        Ok(self
            .shared
            .raw
            .nic_load_stats()?
            .into_iter()
            .map(|n| NicLoad {
                device: n.device,
                inflight_bytes: n.inflight_bytes,
                ewma_bandwidth_bps: n.ewma_bandwidth_bps,
            })
            .collect())
    }

    /// Local NICs, NIC topology and installed transports (upstream's
    /// `showLinks`), as readable text or JSON.
    pub fn show_links(&self, json: bool) -> Result<String> {
        self.shared.raw.show_links(json)
    }

    /// Runs NIC discovery again (upstream's `discoverTopology`): re-reads
    /// the ports of the RDMA NICs, or, without RDMA, probes for NICs; what
    /// it found shows in [`show_links`](Self::show_links).
    pub fn discover_topology(&self) -> Result<()> {
        self.shared.raw.discover_topology()
    }

    /// Removes an installed transport (`"rdma"` or `"tcp"`, upstream's
    /// `uninstallTransport`); new transfers no longer use it. RDMA transfers
    /// in flight fail; TCP ones finish, and TCP cannot be installed again.
    pub fn uninstall_transport(&self, protocol: &str) -> Result<()> {
        self.shared.raw.uninstall_transport(protocol)?;
        tracing::info!(target: "mooncake", protocol, "transport uninstalled");
        Ok(())
    }

    /// Whether the TCP and RDMA transports are installed now.
    pub fn transports(&self) -> Result<(bool, bool)> {
        let p = self.shared.raw.transports()?;
        Ok((
            p & mooncake_sys::MC_PROTOCOL_TCP != 0,
            p & mooncake_sys::MC_PROTOCOL_RDMA != 0,
        ))
    }

    /// Registers a borrowed buffer for the duration of `f`. The buffer is
    /// unregistered when `f` returns (or unwinds), after every transfer that
    /// touches it has finished, so it can never be freed while registered.
    pub fn with_registered<R>(
        &self,
        buffer: &mut [u8],
        access: Access,
        f: impl FnOnce(&RegisteredSlice<'_>) -> R,
    ) -> Result<R> {
        let reg = RegisteredSlice::new(self.shared.clone(), buffer, access)?;
        Ok(f(&reg))
    }

    /// This engine's own segment, for transfers between its own buffers
    /// (host and GPU memory in any combination, copied in place, without the
    /// network). Targets must be remote-accessible, as for peers.
    pub fn local_segment(&self) -> RemoteSegment {
        RemoteSegment::local(self.shared.clone(), &self.shared.segment_name)
    }

    /// What this engine has moved so far, by path: useful to check that
    /// same-host GPU transfers took CUDA IPC rather than TCP.
    pub fn counters(&self) -> Result<EngineCounters> {
        let c = self.shared.raw.counters()?;
        let b = self.shared.raw.batch_counters()?;
        Ok(EngineCounters {
            tcp_requests_sent: c.tcp_requests_sent,
            tcp_requests_served: c.tcp_requests_served,
            tcp_requests_rejected: c.tcp_requests_rejected,
            ipc_copies: c.ipc_copies,
            local_copies: c.local_copies,
            same_host_requests: c.same_host_requests,
            same_host_served: c.same_host_served,
            tasks_submitted: b.tasks_submitted,
            task_status_reads: b.task_status_reads,
        })
    }

    /// The RDMA transport's discovered topology: the NICs it opened (name,
    /// link layer, NUMA node, GID, LID, whether usable) and the priority
    /// matrix saying which NICs serve which memory location (see
    /// [`RdmaTopology::nics_for`]). Fails with
    /// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) when
    /// the engine has no RDMA transport ([`has_rdma`](Self::has_rdma)), and
    /// with [`Error::Decode`](crate::Error::Decode) if the engine's JSON
    /// cannot be decoded.
    ///
    /// ```no_run
    /// # fn main() -> mooncake::Result<()> {
    /// let engine = mooncake::Engine::builder().protocol(mooncake::Protocol::Rdma).build()?;
    /// let topo = engine.rdma_topology()?;
    /// let ib: Vec<&str> = topo
    ///     .devices
    ///     .iter()
    ///     .filter(|d| d.link_layer == mooncake::LinkLayer::Ib)
    ///     .map(|d| d.name.as_str())
    ///     .collect();
    /// let host_nics = topo.nics_for("cpu:0");
    /// # let _ = (ib, host_nics);
    /// # Ok(())
    /// # }
    /// ```
    pub fn rdma_topology(&self) -> Result<RdmaTopology> {
        RdmaTopology::from_json(&self.rdma_topology_json()?)
    }

    /// The topology as the engine's JSON text:
    /// `{"devices":[{"name","link_layer","numa_node","usable","gid","lid"}...],
    /// "priority_matrix":{"<location>":[[preferred...],[available...]]}}`
    /// (what [`rdma_topology`](Self::rdma_topology) decodes; for logging).
    pub fn rdma_topology_json(&self) -> Result<String> {
        self.shared.raw.rdma_topology()
    }

    /// Per-NIC RDMA counters since the engine started (work requests,
    /// bytes, errors, retries; initiator side). Take two snapshots and
    /// [`RdmaCounters::since`] to see what a transfer did. Fails when the
    /// engine has no RDMA transport, like
    /// [`rdma_topology`](Self::rdma_topology).
    pub fn rdma_counters(&self) -> Result<RdmaCounters> {
        RdmaCounters::from_json(&self.rdma_counters_json()?)
    }

    /// The counters as the engine's JSON text: `[{"name","link_layer",
    /// "numa_node","usable","work_requests","bytes","errors","retries"}...]`.
    pub fn rdma_counters_json(&self) -> Result<String> {
        self.shared.raw.rdma_counters()
    }

    /// Whether the RDMA transport is installed (always false for
    /// [`Protocol::Tcp`](crate::Protocol::Tcp); for
    /// [`Protocol::Auto`](crate::Protocol::Auto), see
    /// [`rdma_unavailable_reason`](Self::rdma_unavailable_reason)).
    pub fn has_rdma(&self) -> bool {
        self.shared.raw.rdma_topology().is_ok()
    }

    /// For an engine built with [`Protocol::Auto`](crate::Protocol::Auto)
    /// that fell back to TCP: why RDMA was not installed (the engine's
    /// error, e.g. no verbs library or no NIC left after the allow-list, or
    /// `MC_FORCE_TCP`). `None` when RDMA is installed or was not asked for.
    pub fn rdma_unavailable_reason(&self) -> Option<&str> {
        self.shared.rdma_unavailable.as_deref()
    }

    /// Registers any registrable memory (a GPU buffer, a cudarc slice, ...)
    /// borrowed for the duration of `f`, with the same guarantees as
    /// [`with_registered`](Self::with_registered).
    pub fn with_registered_memory<M: RegisterableMemory, R>(
        &self,
        memory: &mut M,
        access: Access,
        f: impl FnOnce(&RegisteredSlice<'_>) -> R,
    ) -> Result<R> {
        let reg = RegisteredSlice::new_memory(self.shared.clone(), memory, access)?;
        Ok(f(&reg))
    }

    /// Opens a remote segment by name (P2P: `"<host>:<handshake port>"`),
    /// fetching its descriptor unless it is cached.
    pub fn open_segment(&self, name: &str) -> Result<RemoteSegment> {
        RemoteSegment::open(self.shared.clone(), name, false)
    }

    /// [`open_segment`](Self::open_segment) for async code: the handshake
    /// (bounded by the engine's handshake timeouts) runs on a short-lived
    /// thread of its own, and the future resolves with the segment.
    ///
    /// ```
    /// # use mooncake::Engine;
    /// # fn main() -> mooncake::Result<()> {
    /// let target = Engine::builder().build()?;
    /// let initiator = Engine::builder().build()?;
    /// let open = initiator.open_segment_async(target.segment_name())?;
    /// let peer = futures::executor::block_on(open)?;
    /// assert_eq!(peer.name(), target.segment_name());
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "async")]
    pub fn open_segment_async(&self, name: &str) -> Result<crate::OpenSegment> {
        let (engine, owned) = (self.clone(), name.to_string());
        crate::segment_open::OpenSegment::spawn(name, move || engine.open_segment(&owned))
    }

    /// Opens a remote segment, always fetching a fresh descriptor.
    pub fn open_segment_fresh(&self, name: &str) -> Result<RemoteSegment> {
        RemoteSegment::open(self.shared.clone(), name, true)
    }

    /// Re-fetches every cached remote descriptor.
    pub fn refresh_segments(&self) -> Result<()> {
        self.shared.raw.sync_segment_cache()
    }

    /// A new batch that can hold `capacity` requests.
    pub fn batch<'r>(&self, capacity: usize) -> Result<Batch<'r>> {
        Batch::new(self.shared.clone(), capacity)
    }

    /// Drains the notifications peers have sent to this engine.
    pub fn notifications(&self) -> Result<Vec<Notification>> {
        self.shared.raw.drain_notifications()
    }

    /// A batch of up to `capacity` requests for async code: it shares
    /// ownership of the memory it uses, and its completion is a future (see
    /// [`AsyncBatch`](crate::AsyncBatch)). The first async use of an engine
    /// starts its reactor thread.
    #[cfg(feature = "async")]
    pub fn async_batch(&self, capacity: usize) -> Result<crate::AsyncBatch> {
        crate::async_batch::AsyncBatch::new(self.shared.clone(), capacity)
    }

    /// The notifications peers send to this engine, as a stream (see
    /// [`NotificationStream`](crate::NotificationStream)).
    #[cfg(feature = "async")]
    pub fn notification_stream(&self) -> Result<crate::NotificationStream> {
        crate::notify_stream::NotificationStream::new(self.shared.clone())
    }
}

impl EngineBuilder {
    /// Starts the engine: binds its listeners and installs the transport.
    //
    // Defined here rather than in `config` so that the configuration layer
    // never has to name the `Engine` that sits above it.
    pub fn build(self) -> Result<Engine> {
        Ok(Engine::from_shared(self.start()?))
    }
}

/// Transfer counts of one engine since it was created ([`Engine::counters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// TCP requests this engine sent as initiator.
    pub tcp_requests_sent: u64,
    /// TCP requests it served as target.
    pub tcp_requests_served: u64,
    /// TCP requests it refused as target (outside every registered buffer).
    pub tcp_requests_rejected: u64,
    /// Requests it moved by CUDA IPC (same-host GPU path) as initiator.
    pub ipc_copies: u64,
    /// Requests to its own segment, copied in place.
    pub local_copies: u64,
    /// Requests it moved by the same-host CPU path as initiator (see
    /// [`EngineBuilder::same_host_path`](crate::EngineBuilder::same_host_path)).
    pub same_host_requests: u64,
    /// Same-host copies it performed for peers as target.
    pub same_host_served: u64,
    /// Requests accepted by submits of this engine's batches.
    pub tasks_submitted: u64,
    /// Request statuses handed to callers, one per request per read. A
    /// caller that reads each status once keeps this close to
    /// `tasks_submitted`; [`Batch::status`](crate::Batch::status) and
    /// [`Batch::statuses`](crate::Batch::statuses) each cost one read per
    /// request they report.
    pub task_status_reads: u64,
}
