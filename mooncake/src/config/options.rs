//! The option types an [`EngineBuilder`](super::EngineBuilder) takes.
use mooncake_sys as sys;

/// Where peers find segment descriptors.
///
/// With a store (etcd, Redis, HTTP) an engine is named by
/// [`EngineBuilder::segment_name`](super::EngineBuilder::segment_name) and
/// publishes its handshake address and descriptor under upstream's keys
/// (`mooncake/rpc_meta/<name>`, `mooncake/ram/<name>`), so upstream engines
/// using the same store open it by name, and it opens theirs.
///
/// ```
/// use mooncake::Metadata;
///
/// # fn main() -> mooncake::Result<()> {
/// let m: Metadata = "etcd://10.0.0.1:2379,10.0.0.2:2379".parse()?;
/// assert_eq!(m, Metadata::Etcd(vec!["10.0.0.1:2379".into(), "10.0.0.2:2379".into()]));
/// assert_eq!(m.conn_string(), "etcd://10.0.0.1:2379,10.0.0.2:2379");
/// assert_eq!("P2PHANDSHAKE".parse::<Metadata>()?, Metadata::P2pHandshake);
/// assert!("ftp://x".parse::<Metadata>().is_err());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Metadata {
    /// No metadata server: descriptors are fetched from their owner over the
    /// handshake port (upstream's `P2PHANDSHAKE`). Segment names are
    /// `"<host>:<handshake port>"`.
    P2pHandshake,
    /// An etcd cluster, through its v3 JSON gateway: endpoints
    /// `"host:port"` (or `"http://host:port"`). A member that is down is
    /// skipped; each call is bounded by
    /// [`metadata_timeout`](super::EngineBuilder::metadata_timeout).
    Etcd(Vec<String>),
    /// A Redis server, `"redis://host:port"` (port 12001 when missing, as
    /// upstream). AUTH and SELECT from
    /// [`redis_auth`](super::EngineBuilder::redis_auth) and
    /// [`redis_db`](super::EngineBuilder::redis_db), else `MC_REDIS_USERNAME`,
    /// `MC_REDIS_PASSWORD` and `MC_REDIS_DB_INDEX`.
    Redis(String),
    /// An HTTP metadata server speaking upstream's protocol (upstream's
    /// Python server, or this project's `mooncake-metadata-server`):
    /// `"http://host:port/metadata"`. `https` is refused: the engine has no
    /// TLS.
    Http(String),
}

impl Metadata {
    /// The connection string the engine is given (upstream's
    /// `metadata_conn_string`).
    pub fn conn_string(&self) -> String {
        match self {
            Metadata::P2pHandshake => "P2PHANDSHAKE".into(),
            Metadata::Etcd(endpoints) => format!("etcd://{}", endpoints.join(",")),
            Metadata::Redis(url) | Metadata::Http(url) => url.clone(),
        }
    }

    /// Whether segment names are the engines' own choice, published in a
    /// store (everything but [`P2pHandshake`](Self::P2pHandshake)).
    pub fn is_centralised(&self) -> bool {
        !matches!(self, Metadata::P2pHandshake)
    }
}

impl std::str::FromStr for Metadata {
    type Err = crate::Error;

    /// Upstream's rules: `P2PHANDSHAKE`; `etcd://` with endpoints separated
    /// by `,` or `;`; `redis://`; `http://` (and `https://`, which the engine
    /// then refuses); a string without `://` is an etcd endpoint list.
    fn from_str(s: &str) -> crate::Result<Self> {
        let s = s.trim();
        let endpoints = |list: &str| -> crate::Result<Vec<String>> {
            let v: Vec<String> = list
                .split([',', ';'])
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(String::from)
                .collect();
            if v.is_empty() {
                return Err(crate::Error::InvalidArgument(format!(
                    "metadata connection string {s:?} names no etcd endpoint"
                )));
            }
            Ok(v)
        };
        if s == "P2PHANDSHAKE" {
            return Ok(Metadata::P2pHandshake);
        }
        match s.split_once("://") {
            None => Ok(Metadata::Etcd(endpoints(s)?)),
            Some(("etcd", rest)) => Ok(Metadata::Etcd(endpoints(rest)?)),
            Some(("redis", _)) => Ok(Metadata::Redis(s.to_string())),
            Some(("http" | "https", _)) => Ok(Metadata::Http(s.to_string())),
            Some((scheme, _)) => Err(crate::Error::InvalidArgument(format!(
                "metadata connection string {s:?}: unknown scheme {scheme:?} (P2PHANDSHAKE, \
                 etcd://, redis:// or http://)"
            ))),
        }
    }
}

/// The transport used for data.
///
/// [`Auto`](Self::Auto) takes RDMA where a usable NIC exists and says why
/// not where none does:
///
/// ```
/// use mooncake::{Engine, Protocol};
///
/// # fn main() -> mooncake::Result<()> {
/// let engine = Engine::builder().protocol(Protocol::Auto).build()?;
/// assert_eq!(engine.has_rdma(), engine.rdma_unavailable_reason().is_none());
/// if let Some(why) = engine.rdma_unavailable_reason() {
///     println!("TCP only: {why}");
/// }
/// assert!(engine.transports()?.0); // TCP is always installed
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Protocol {
    /// TCP, wire-compatible with upstream Mooncake's TCP transport.
    Tcp,
    /// RDMA (RC QPs through libibverbs, loaded at run time: env
    /// `MC_VERBS_LIBRARY`, else `libibverbs.so.1`), wire-compatible with
    /// upstream Mooncake's RDMA transport. TCP is installed as well, for
    /// peers that only speak TCP. Building fails when no usable NIC is found.
    Rdma,
    /// RDMA when a usable NIC exists, else TCP alone (like upstream's
    /// auto-discovery);
    /// [`Engine::rdma_unavailable_reason`](crate::Engine::rdma_unavailable_reason)
    /// says why RDMA was not installed. Upstream's overrides apply: `MC_FORCE_TCP` (set,
    /// any value) gives TCP alone without trying RDMA, and `MC_FORCE_HCA`
    /// makes a failure to bring up RDMA a build error.
    Auto,
}

/// Framing spoken by the TCP initiator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpVersion {
    /// Acknowledged framing (status frames); used when the peer advertises it.
    V2,
    /// Legacy framing: WRITEs complete when sent, rejections are silent
    /// (upstream's `MC_TCP_PROTO=1`).
    V1,
}

/// How GPU memory is registered for RDMA (upstream's `WITH_NVIDIA_PEERMEM`).
///
/// ```
/// use mooncake::{Engine, GpuRegistration};
///
/// # fn main() -> mooncake::Result<()> {
/// let engine = Engine::builder().gpu_registration(GpuRegistration::DmaBuf).build()?;
/// assert_eq!(engine.gpu_registration()?, GpuRegistration::DmaBuf);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GpuRegistration {
    /// Decided by `WITH_NVIDIA_PEERMEM` when the engine starts (upstream's
    /// parsing: `1/true/yes/on/enable` or `0/false/no/off/disable`; default
    /// true, i.e. [`PeerMem`](Self::PeerMem)).
    FromEnv,
    /// Plain `ibv_reg_mr` on the device pointer; needs `nvidia-peermem`.
    PeerMem,
    /// Export a DMA-BUF fd and register that; needs no kernel module.
    DmaBuf,
    /// Detect which of the two works on this host.
    Auto,
}

impl GpuRegistration {
    pub(crate) fn raw(self) -> i32 {
        match self {
            Self::FromEnv => sys::MC_GPU_REG_FROM_ENV as i32,
            Self::PeerMem => sys::MC_GPU_REG_PEERMEM as i32,
            Self::DmaBuf => sys::MC_GPU_REG_DMABUF as i32,
            Self::Auto => sys::MC_GPU_REG_AUTO as i32,
        }
    }

    pub(crate) fn from_raw(v: i32) -> Self {
        match v {
            1 => Self::PeerMem,
            2 => Self::DmaBuf,
            3 => Self::Auto,
            _ => Self::FromEnv,
        }
    }
}
