//! Engine configuration: the builder and its option types.
use std::ops::RangeInclusive;
use std::time::Duration;

use std::sync::Arc;

use mooncake_sys as sys;

use crate::error::{Error, Result};
use crate::ffi::{self, OwnedCString, RawEngine};
use crate::shared::EngineShared;

mod options;

pub use options::{GpuRegistration, Metadata, Protocol, TcpVersion};

/// Builds an [`Engine`](crate::Engine). Defaults follow upstream Mooncake
/// (and its `MC_*` environment variables), except that listeners bind to the local host
/// rather than to every interface.
///
/// ```
/// use std::time::Duration;
/// use mooncake::{Engine, Protocol};
///
/// # fn main() -> mooncake::Result<()> {
/// let engine = Engine::builder()
///     .local_host("127.0.0.1")
///     .protocol(Protocol::Tcp)
///     .port_range(20000..=20999) // random handshake and data ports from here
///     .device_allow_list(["mlx5_0", "mlx5_1"]) // RDMA NICs, if RDMA is used
///     .tcp_progress_timeout(Duration::from_secs(10))
///     .build()?;
/// assert!((20000..=20999).contains(&engine.rpc_port()));
/// assert!(engine.segment_name().starts_with("127.0.0.1:"));
/// let (allowed, _denied) = engine.device_filters()?;
/// assert_eq!(allowed, ["mlx5_0", "mlx5_1"]);
/// # Ok(())
/// # }
/// ```
///
/// Values out of range fail [`build`](Self::build) with an error naming
/// them:
///
/// ```
/// use mooncake::{Engine, ErrorCode};
///
/// let err = Engine::builder().port_range(0..=100).build().unwrap_err();
/// assert_eq!(err.code(), ErrorCode::InvalidArgument);
///
/// let err = Engine::builder().allowed_peer_networks(["10.0.0.0/99"]).build().unwrap_err();
/// assert!(err.to_string().contains("10.0.0.0/99"), "{err}");
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct EngineBuilder {
    metadata: Metadata,
    local_host: String,
    bind_address: Option<String>,
    protocol: Protocol,
    rpc_port: u16,
    tcp_data_port: u16,
    port_range: Option<RangeInclusive<u16>>,
    handshake_connect_timeout: Option<Duration>,
    handshake_timeout: Option<Duration>,
    tcp_connect_timeout: Option<Duration>,
    tcp_progress_timeout: Option<Duration>,
    tcp_lanes_per_peer: Option<u32>,
    tcp_pipeline_depth: Option<u32>,
    tcp_version: Option<TcpVersion>,
    metadata_cache: Option<bool>,
    same_host_path: Option<bool>,
    cuda_ipc: Option<bool>,
    device_allow_list: Option<String>,
    device_deny_list: Option<String>,
    gpu_registration: GpuRegistration,
    limits: Limits,
    store: StoreOptions,
}

/// Centralised-metadata settings; `None` keeps the engine's default (or
/// `MC_*` variable).
#[derive(Debug, Clone, Default)]
struct StoreOptions {
    segment_name: Option<String>,
    cluster_id: Option<String>,
    timeout: Option<Duration>,
    lease_ttl: Option<Duration>,
    redis_username: Option<String>,
    redis_password: Option<String>,
    redis_db: Option<u8>,
}

/// Listener limits; `None` keeps the engine's default (or `MC_*` variable).
#[derive(Debug, Clone, Default)]
struct Limits {
    tcp_max_server_connections: Option<u32>,
    tcp_max_connections_per_source: Option<u32>,
    tcp_idle_timeout: Option<Duration>,
    tcp_pooled_idle_timeout: Option<Duration>,
    tcp_server_workers: Option<u32>,
    handshake_max_connections: Option<u32>,
    handshake_max_connections_per_source: Option<u32>,
    notify_max_bytes: Option<u64>,
    notify_max_message_bytes: Option<u32>,
    allowed_peer_networks: Option<String>,
}

impl Limits {
    /// Sets the numeric limits (the allowed networks, a string, are set by
    /// the caller, which keeps the C string alive).
    fn apply(&self, cfg: &mut sys::mc_engine_config_t) -> Result<()> {
        if let Some(n) = self.tcp_max_server_connections {
            cfg.tcp_max_server_connections = n;
        }
        if let Some(n) = self.tcp_max_connections_per_source {
            cfg.tcp_max_connections_per_source = n;
        }
        if let Some(d) = self.tcp_idle_timeout {
            cfg.tcp_idle_timeout_ms = millis("tcp_idle_timeout", d)?;
        }
        if let Some(d) = self.tcp_pooled_idle_timeout {
            cfg.tcp_pooled_idle_timeout_ms = millis("tcp_pooled_idle_timeout", d)?;
        }
        if let Some(n) = self.tcp_server_workers {
            cfg.tcp_server_workers = n;
        }
        if let Some(n) = self.handshake_max_connections {
            cfg.handshake_max_connections = n;
        }
        if let Some(n) = self.handshake_max_connections_per_source {
            cfg.handshake_max_connections_per_source = n;
        }
        if let Some(n) = self.notify_max_bytes {
            cfg.notify_max_bytes = n;
        }
        if let Some(n) = self.notify_max_message_bytes {
            cfg.notify_max_message_bytes = n;
        }
        Ok(())
    }
}

/// The C strings of [`StoreOptions`], alive until the engine is created.
struct StoreStrings {
    segment_name: Option<OwnedCString>,
    _others: Vec<OwnedCString>,
}

impl StoreOptions {
    /// Checks the settings against the metadata mode and sets them in
    /// `cfg`; the returned strings must outlive the engine's creation.
    fn apply(
        &self,
        metadata: &Metadata,
        cfg: &mut sys::mc_engine_config_t,
    ) -> Result<StoreStrings> {
        let mut others = Vec::new();
        let segment_name = match (&self.segment_name, metadata.is_centralised()) {
            (Some(_), false) => return Err(Error::InvalidArgument(
                "segment_name needs a metadata store: in P2PHANDSHAKE mode the segment name is \
                     always \"<local host>:<handshake port>\""
                    .into(),
            )),
            (None, true) => {
                return Err(Error::InvalidArgument(format!(
                    "a metadata store ({}) needs a segment name: EngineBuilder::segment_name",
                    metadata.conn_string()
                )))
            }
            (Some(n), true) if n.trim().is_empty() => {
                return Err(Error::InvalidArgument("segment_name is empty".into()))
            }
            (Some(n), true) => Some(OwnedCString::new("segment_name", n)?),
            (None, false) => None,
        };
        if let Some(id) = &self.cluster_id {
            let c = OwnedCString::new("metadata_cluster_id", id)?;
            cfg.metadata_cluster_id = c.as_ptr();
            others.push(c);
        }
        if let Some(d) = self.timeout {
            cfg.metadata_timeout_ms = millis("metadata_timeout", d)?;
        }
        if let Some(ttl) = self.lease_ttl {
            if ttl.subsec_nanos() != 0 || ttl.as_secs() > 86_400 {
                return Err(Error::InvalidArgument(format!(
                    "metadata_lease_ttl of {ttl:?} is not a whole number of seconds in 0..=86400"
                )));
            }
            cfg.metadata_lease_ttl_s = ttl.as_secs() as u32;
        }
        if let Some(u) = &self.redis_username {
            let c = OwnedCString::new("redis username", u)?;
            cfg.redis_username = c.as_ptr();
            others.push(c);
        }
        if let Some(p) = &self.redis_password {
            let c = OwnedCString::new("redis password", p)?;
            cfg.redis_password = c.as_ptr();
            others.push(c);
        }
        if let Some(db) = self.redis_db {
            cfg.redis_db = i32::from(db);
        }
        Ok(StoreStrings {
            segment_name,
            _others: others,
        })
    }
}

impl Default for EngineBuilder {
    fn default() -> Self {
        Self {
            metadata: Metadata::P2pHandshake,
            local_host: "127.0.0.1".into(),
            bind_address: None,
            protocol: Protocol::Tcp,
            rpc_port: 0,
            tcp_data_port: 0,
            port_range: None,
            handshake_connect_timeout: None,
            handshake_timeout: None,
            tcp_connect_timeout: None,
            tcp_progress_timeout: None,
            tcp_lanes_per_peer: None,
            tcp_pipeline_depth: None,
            tcp_version: None,
            metadata_cache: None,
            same_host_path: None,
            cuda_ipc: None,
            device_allow_list: None,
            device_deny_list: None,
            gpu_registration: GpuRegistration::FromEnv,
            limits: Limits::default(),
            store: StoreOptions::default(),
        }
    }
}

fn millis(what: &str, d: Duration) -> Result<u32> {
    let ms = d.as_millis();
    if ms == 0 || ms > u128::from(u32::MAX) {
        return Err(Error::InvalidArgument(format!(
            "{what} of {d:?} is not in 1 ms..{} ms",
            u32::MAX
        )));
    }
    Ok(ms as u32)
}

impl EngineBuilder {
    /// How descriptors are found (default [`Metadata::P2pHandshake`]).
    pub fn metadata(mut self, m: Metadata) -> Self {
        self.metadata = m;
        self
    }

    /// The host (IP or name) peers use to reach this engine (default
    /// `127.0.0.1`). In P2PHANDSHAKE mode it becomes the host part of the
    /// segment name; with a metadata store it is the address published in
    /// `rpc_meta` and as the TCP data host.
    pub fn local_host(mut self, host: impl Into<String>) -> Self {
        self.local_host = host.into();
        self
    }

    /// The segment name under which this engine publishes itself in a
    /// metadata store, and by which peers open it. Required with a store;
    /// refused in P2PHANDSHAKE mode, where the name is always
    /// `"<local host>:<handshake port>"`.
    pub fn segment_name(mut self, name: impl Into<String>) -> Self {
        self.store.segment_name = Some(name.into());
        self
    }

    /// Keys live under `mooncake/<id>/` instead of `mooncake/` (default:
    /// env `MC_METADATA_CLUSTER_ID`), so several clusters share one store.
    pub fn metadata_cluster_id(mut self, id: impl Into<String>) -> Self {
        self.store.cluster_id = Some(id.into());
        self
    }

    /// The longest one metadata-store call may take, connects and every
    /// etcd endpoint included (default 5 s, or env `MC_METADATA_TIMEOUT_MS`).
    /// A store that is down or slow fails the call with
    /// [`ErrorCode::Metadata`](crate::ErrorCode::Metadata) within it.
    pub fn metadata_timeout(mut self, d: Duration) -> Self {
        self.store.timeout = Some(d);
        self
    }

    /// Keeps this engine's keys on an etcd lease (Redis: an expiry) of this
    /// length, renewed while the engine lives, so the keys of an engine that
    /// crashed vanish after it. Whole seconds, at most a day; zero (the
    /// default, or env `MC_METADATA_LEASE_TTL_SEC`) keeps upstream's
    /// behaviour: keys live until the engine deletes them. Readers,
    /// upstream's included, see the same values either way.
    pub fn metadata_lease_ttl(mut self, ttl: Duration) -> Self {
        self.store.lease_ttl = Some(ttl);
        self
    }

    /// Redis `AUTH` (default: env `MC_REDIS_USERNAME`, `MC_REDIS_PASSWORD`).
    pub fn redis_auth(mut self, username: Option<&str>, password: &str) -> Self {
        self.store.redis_username = username.map(String::from);
        self.store.redis_password = Some(password.into());
        self
    }

    /// Redis `SELECT` index (default: env `MC_REDIS_DB_INDEX`, else 0).
    pub fn redis_db(mut self, db: u8) -> Self {
        self.store.redis_db = Some(db);
        self
    }

    /// The address the listeners bind to. Default: env `MC_BIND_ADDRESS`
    /// when set and not blank (trimmed; the engine reads it), else the local
    /// host when it is a numeric address, else every interface (upstream
    /// always binds every interface). `"::"` or `"0.0.0.0"` bind every
    /// interface.
    pub fn bind_address(mut self, addr: impl Into<String>) -> Self {
        self.bind_address = Some(addr.into());
        self
    }

    /// The data transport (default [`Protocol::Tcp`]).
    pub fn protocol(mut self, p: Protocol) -> Self {
        self.protocol = p;
        self
    }

    /// A fixed handshake port (default: random in the port range).
    pub fn rpc_port(mut self, port: u16) -> Self {
        self.rpc_port = port;
        self
    }

    /// A fixed TCP data port (default: random in the port range).
    pub fn tcp_data_port(mut self, port: u16) -> Self {
        self.tcp_data_port = port;
        self
    }

    /// Range for random ports (default 15000..=17000, or
    /// `MC_MIN_RPC_PORT`..=`MC_MAX_RPC_PORT`).
    pub fn port_range(mut self, r: RangeInclusive<u16>) -> Self {
        self.port_range = Some(r);
        self
    }

    /// Connect timeout of handshake requests (default 5 s).
    pub fn handshake_connect_timeout(mut self, d: Duration) -> Self {
        self.handshake_connect_timeout = Some(d);
        self
    }

    /// Bound on a whole handshake exchange, both as client and as server
    /// (default 10 s).
    pub fn handshake_timeout(mut self, d: Duration) -> Self {
        self.handshake_timeout = Some(d);
        self
    }

    /// Connect timeout of TCP data connections (default 5 s).
    pub fn tcp_connect_timeout(mut self, d: Duration) -> Self {
        self.tcp_connect_timeout = Some(d);
        self
    }

    /// A TCP transfer that makes no progress for this long fails (default
    /// 30 s, or `MC_TCP_PROGRESS_TIMEOUT_SEC`).
    pub fn tcp_progress_timeout(mut self, d: Duration) -> Self {
        self.tcp_progress_timeout = Some(d);
        self
    }

    /// Persistent connections per peer (default 4, or
    /// `MC_TCP_LANES_PER_PEER`).
    pub fn tcp_lanes_per_peer(mut self, n: u32) -> Self {
        self.tcp_lanes_per_peer = Some(n);
        self
    }

    /// Requests in flight per connection (default 64).
    pub fn tcp_pipeline_depth(mut self, n: u32) -> Self {
        self.tcp_pipeline_depth = Some(n);
        self
    }

    /// TCP framing as initiator (default [`TcpVersion::V2`], or V1 with
    /// `MC_TCP_PROTO=1`).
    pub fn tcp_version(mut self, v: TcpVersion) -> Self {
        self.tcp_version = Some(v);
        self
    }

    /// Cache remote descriptors (default true; `MC_DISABLE_METACACHE`
    /// turns it off).
    pub fn metadata_cache(mut self, on: bool) -> Self {
        self.metadata_cache = Some(on);
        self
    }

    /// The same-host CPU path (default on, or off with
    /// `MC_DISABLE_SAME_HOST_PATH`): when a peer engine runs in another
    /// process of this host, host memory moves by cross-memory attach
    /// (`process_vm_readv`/`process_vm_writev`, one copy, no TCP payload),
    /// over a Unix socket where the kernel attests the peer's identity
    /// (same user, another process). Upstream peers never advertise it and
    /// get plain TCP; so do engines of one process, other users, peers the
    /// kernel does not let us attach to (ptrace rules), other PID
    /// namespaces and hosts. Off: this engine neither uses nor offers it.
    pub fn same_host_path(mut self, on: bool) -> Self {
        self.same_host_path = Some(on);
        self
    }

    /// The same-host GPU path (default on in a CUDA build): GPU memory of an
    /// engine in another process of this host moves by CUDA IPC, GPU to GPU
    /// through a mapping of the peer's allocation, instead of over TCP
    /// staged through pinned host memory. Off: this engine neither maps
    /// peers' GPU memory nor publishes IPC handles for its own, so GPU
    /// memory always goes over TCP (or RDMA).
    pub fn cuda_ipc(mut self, on: bool) -> Self {
        self.cuda_ipc = Some(on);
        self
    }

    /// RDMA devices the engine may use, e.g. `["mlx5_0", "mlx5_1"]` (the
    /// connector's `device_name`; default: `MC_TE_FILTERS`, else all).
    pub fn device_allow_list<S: AsRef<str>>(
        mut self,
        devices: impl IntoIterator<Item = S>,
    ) -> Self {
        self.device_allow_list = Some(join(devices));
        self
    }

    /// RDMA devices the engine must not use.
    pub fn device_deny_list<S: AsRef<str>>(mut self, devices: impl IntoIterator<Item = S>) -> Self {
        self.device_deny_list = Some(join(devices));
        self
    }

    /// How GPU memory is registered (default [`GpuRegistration::FromEnv`]).
    pub fn gpu_registration(mut self, mode: GpuRegistration) -> Self {
        self.gpu_registration = mode;
        self
    }

    /// Most connections the TCP data port holds at once (default 1024,
    /// `MC_TCP_MAX_SERVER_CONNECTIONS`); more are closed at accept.
    pub fn tcp_max_server_connections(mut self, n: u32) -> Self {
        self.limits.tcp_max_server_connections = Some(n);
        self
    }

    /// Most data-port connections from one source address (default 0 =
    /// max(8, [`tcp_max_server_connections`](Self::tcp_max_server_connections) / 8),
    /// `MC_TCP_MAX_CONNECTIONS_PER_SOURCE`), so that one client cannot take
    /// every slot.
    pub fn tcp_max_connections_per_source(mut self, n: u32) -> Self {
        self.limits.tcp_max_connections_per_source = Some(n);
        self
    }

    /// Time a fresh data-port connection has to send its first complete
    /// request header before it is closed (default 5 s,
    /// `MC_TCP_IDLE_TIMEOUT_MS`).
    pub fn tcp_idle_timeout(mut self, d: Duration) -> Self {
        self.limits.tcp_idle_timeout = Some(d);
        self
    }

    /// Time a data-port connection that has served requests may stay idle
    /// between them before it is closed (default 120 s,
    /// `MC_TCP_POOLED_IDLE_TIMEOUT_MS`); clients reconnect when needed.
    pub fn tcp_pooled_idle_timeout(mut self, d: Duration) -> Self {
        self.limits.tcp_pooled_idle_timeout = Some(d);
        self
    }

    /// Worker threads that serve data-port connections with a request
    /// ready (default 0 = from the core count, 8..64;
    /// `MC_TCP_SERVER_WORKERS`). Idle connections hold no thread.
    pub fn tcp_server_workers(mut self, n: u32) -> Self {
        self.limits.tcp_server_workers = Some(n);
        self
    }

    /// Most connections the handshake port holds at once; beyond it the
    /// oldest is dropped (default 256, `MC_HANDSHAKE_MAX_CONNECTIONS`).
    pub fn handshake_max_connections(mut self, n: u32) -> Self {
        self.limits.handshake_max_connections = Some(n);
        self
    }

    /// Most handshake-port connections from one source address (default 0
    /// = max(8, [`handshake_max_connections`](Self::handshake_max_connections) / 8),
    /// `MC_HANDSHAKE_MAX_CONNECTIONS_PER_SOURCE`).
    pub fn handshake_max_connections_per_source(mut self, n: u32) -> Self {
        self.limits.handshake_max_connections_per_source = Some(n);
        self
    }

    /// Bytes (name + message) of received notifications queued until the
    /// application drains them (default 64 MiB, `MC_NOTIFY_MAX_BYTES`);
    /// beyond it a peer's notify fails at the peer.
    pub fn notify_max_bytes(mut self, n: u64) -> Self {
        self.limits.notify_max_bytes = Some(n);
        self
    }

    /// Largest received notification, name + message in bytes (default
    /// 64 KiB, `MC_NOTIFY_MAX_MESSAGE_BYTES`); a larger one fails at the
    /// peer.
    pub fn notify_max_message_bytes(mut self, n: u32) -> Self {
        self.limits.notify_max_message_bytes = Some(n);
        self
    }

    /// Source networks allowed to connect to the handshake and data ports,
    /// as CIDR (`"10.1.0.0/16"`, `"fd00::/8"`, or one address); connections
    /// from elsewhere are closed at accept. Default: any
    /// (`MC_ALLOWED_PEER_NETWORKS`, comma-separated). A bad entry fails
    /// [`build`](Self::build) with an error naming it.
    pub fn allowed_peer_networks<S: AsRef<str>>(
        mut self,
        networks: impl IntoIterator<Item = S>,
    ) -> Self {
        self.limits.allowed_peer_networks = Some(join(networks));
        self
    }

    /// Starts the engine and returns the state its objects share
    /// (`Engine` wraps it, in [`build`](Self::build)).
    pub(crate) fn start(self) -> Result<Arc<EngineShared>> {
        ffi::install_log_sink();
        let mut cfg = RawEngine::default_config()?;
        let conn = OwnedCString::new("metadata", &self.metadata.conn_string())?;
        if self.local_host.is_empty() {
            return Err(Error::InvalidArgument("local_host is empty".into()));
        }
        let host = OwnedCString::new("local_host", &self.local_host)?;
        let bind = OwnedCString::new("bind_address", &self.effective_bind_address()?)?;
        cfg.metadata_conn_string = conn.as_ptr();
        cfg.bind_address = bind.as_ptr();
        // Kept alive until the engine is created (it copies them).
        let store_strings = self.store.apply(&self.metadata, &mut cfg)?;
        cfg.local_server_name = match &store_strings.segment_name {
            Some(name) => {
                cfg.advertise_host = host.as_ptr();
                name.as_ptr()
            }
            None => host.as_ptr(),
        };
        self.apply_transport_options(&mut cfg)?;
        let allow = optional_cstring("device_allow_list", self.device_allow_list.as_deref())?;
        let deny = optional_cstring("device_deny_list", self.device_deny_list.as_deref())?;
        if let Some(a) = &allow {
            cfg.device_allow_list = a.as_ptr();
        }
        if let Some(d) = &deny {
            cfg.device_deny_list = d.as_ptr();
        }
        cfg.gpu_registration_mode = self.gpu_registration.raw();
        self.limits.apply(&mut cfg)?;
        let nets = optional_cstring(
            "allowed_peer_networks",
            self.limits.allowed_peer_networks.as_deref(),
        )?;
        if let Some(n) = &nets {
            cfg.allowed_peer_networks = n.as_ptr();
        }
        let raw = RawEngine::create(&cfg)?;
        drop(store_strings);
        // The CStrings above outlive the call; the engine copied them.
        let rdma_unavailable = self.install_auto_transport(&raw)?;
        EngineShared::new(raw, rdma_unavailable)
    }

    /// The address to bind: the explicit one, else `MC_BIND_ADDRESS` (as the
    /// engine reads it), else `local_host` when it is an IP address, else
    /// any.
    fn effective_bind_address(&self) -> Result<String> {
        match &self.bind_address {
            Some(b) => Ok(b.clone()),
            None => Ok(self.default_bind_address(ffi::env_overrides()?.bind_address)),
        }
    }

    /// The bind address when none was given, from `MC_BIND_ADDRESS`
    /// (`from_env`, non-empty when set).
    fn default_bind_address(&self, from_env: Option<String>) -> String {
        match from_env {
            Some(b) => b,
            None if self.local_host.parse::<std::net::IpAddr>().is_ok() => self.local_host.clone(),
            None => String::new(),
        }
    }

    /// Protocol, ports, timeouts and TCP knobs.
    fn apply_transport_options(&self, cfg: &mut sys::mc_engine_config_t) -> Result<()> {
        cfg.protocols = match self.protocol {
            Protocol::Tcp | Protocol::Auto => sys::MC_PROTOCOL_TCP,
            Protocol::Rdma => sys::MC_PROTOCOL_TCP | sys::MC_PROTOCOL_RDMA,
        };
        cfg.rpc_port = self.rpc_port;
        cfg.tcp_data_port = self.tcp_data_port;
        if let Some(r) = &self.port_range {
            if *r.start() == 0 || r.start() > r.end() {
                return Err(Error::InvalidArgument(format!(
                    "port range {r:?} is empty or starts at 0"
                )));
            }
            cfg.port_min = *r.start();
            cfg.port_max = *r.end();
        }
        if let Some(d) = self.handshake_connect_timeout {
            cfg.handshake_connect_timeout_ms = millis("handshake_connect_timeout", d)?;
        }
        if let Some(d) = self.handshake_timeout {
            cfg.handshake_timeout_ms = millis("handshake_timeout", d)?;
        }
        if let Some(d) = self.tcp_connect_timeout {
            cfg.tcp_connect_timeout_ms = millis("tcp_connect_timeout", d)?;
        }
        if let Some(d) = self.tcp_progress_timeout {
            cfg.tcp_progress_timeout_ms = millis("tcp_progress_timeout", d)?;
        }
        if let Some(n) = self.tcp_lanes_per_peer {
            cfg.tcp_lanes_per_peer = n;
        }
        if let Some(n) = self.tcp_pipeline_depth {
            cfg.tcp_pipeline_depth = n;
        }
        if let Some(v) = self.tcp_version {
            cfg.tcp_proto_version = match v {
                TcpVersion::V2 => 2,
                TcpVersion::V1 => 1,
            };
        }
        if let Some(on) = self.metadata_cache {
            cfg.metadata_cache = u32::from(on);
        }
        if let Some(on) = self.same_host_path {
            cfg.enable_same_host = u32::from(on);
        }
        if let Some(on) = self.cuda_ipc {
            cfg.enable_cuda_ipc = u32::from(on);
        }
        Ok(())
    }

    /// For [`Protocol::Auto`]: installs RDMA when it should and can; returns
    /// why it did not, if it did not.
    fn install_auto_transport(&self, raw: &RawEngine) -> Result<Option<String>> {
        if self.protocol != Protocol::Auto {
            return Ok(None);
        }
        let env = ffi::env_overrides()?;
        match auto_choice(env.force_tcp, env.force_hca) {
            AutoChoice::TcpForced => {
                tracing::info!(target: "mooncake", "protocol Auto: MC_FORCE_TCP is set; using TCP");
                Ok(Some("MC_FORCE_TCP is set".to_string()))
            }
            AutoChoice::RdmaRequired => raw.install_transport("rdma").map(|()| None),
            AutoChoice::RdmaIfUsable => match raw.install_transport("rdma") {
                Ok(()) => Ok(None),
                Err(e) => {
                    tracing::info!(target: "mooncake", "protocol Auto: no usable RDMA NIC ({e}); using TCP");
                    Ok(Some(e.to_string()))
                }
            },
        }
    }
}

fn optional_cstring(what: &str, s: Option<&str>) -> Result<Option<OwnedCString>> {
    s.map(|s| OwnedCString::new(what, s)).transpose()
}

/// What [`Protocol::Auto`] does, given upstream's overrides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AutoChoice {
    /// `MC_FORCE_TCP`: TCP alone, RDMA not even tried.
    TcpForced,
    /// `MC_FORCE_HCA`: RDMA must come up; failing to is an error.
    RdmaRequired,
    /// RDMA when a usable NIC exists, else TCP.
    RdmaIfUsable,
}

fn auto_choice(force_tcp: bool, force_hca: bool) -> AutoChoice {
    if force_tcp {
        AutoChoice::TcpForced
    } else if force_hca {
        AutoChoice::RdmaRequired
    } else {
        AutoChoice::RdmaIfUsable
    }
}

fn join<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    items
        .into_iter()
        .map(|s| s.as_ref().trim().to_string())
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests;
