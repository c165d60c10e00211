//! The option types an [`EngineBuilder`](super::EngineBuilder) takes.
use mooncake_sys as sys;

/// Where peers find segment descriptors.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Metadata {
    /// No metadata server: descriptors are fetched from their owner over the
    /// handshake port (upstream's `P2PHANDSHAKE`). Segment names are
    /// `"<host>:<handshake port>"`.
    P2pHandshake,
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
