//! Safe Rust API for the mooncake-rs transfer engine, a Mooncake-compatible
//! engine that moves bytes (typically KV cache) between processes with
//! batched, zero-copy READs and WRITEs, and that talks to peers running
//! upstream Mooncake (`mooncake-transfer-engine` 0.3.13) as well as to
//! itself.
//!
//! # Mental model
//!
//! 1. **Engine**: [`Engine::builder`] starts one engine per process (or
//!    more). It owns a *segment*: the set of memory registered with it,
//!    which it serves to peers. Its [`segment_name`](Engine::segment_name)
//!    (`"<host>:<port>"` in P2PHANDSHAKE mode) is how peers find it.
//! 2. **Register** memory ([`Engine::register`] or
//!    [`Engine::with_registered`]): transfers only touch registered memory,
//!    on both sides. [`Access::RemoteAccessible`] memory is published to
//!    peers; [`Access::LocalOnly`] memory is only a source or destination of
//!    this engine's own transfers.
//! 3. **Open** a peer's segment ([`Engine::open_segment`]): fetches its
//!    descriptor (the list of buffers it publishes).
//! 4. **Batch**: queue READs (remote → local) and WRITEs (local → remote) in a
//!    [`Batch`]; remote addresses are absolute addresses inside the peer's
//!    buffers ([`RemoteSegment::buffers`]).
//! 5. **Submit**, then **wait**: [`Batch::submit`] hands the requests over in
//!    one call, [`Batch::wait`] returns when all of them finished, with the
//!    first failure's reason if any failed.
//!
//! Nothing in normal use needs `unsafe`. The rules that make it sound are
//! enforced by types: a registration owns or exclusively borrows its memory
//! and unregisters (waiting for in-flight transfers, ours and peers') before
//! the memory can go away; a batch borrows the registrations it uses and
//! waits for its transfers when dropped; batch ids are private.
//!
//! # Example
//!
//! Two engines in one process; one READs from the other:
//!
//! ```
//! use mooncake::{Access, Engine, HostBuffer};
//!
//! # fn main() -> mooncake::Result<()> {
//! let target = Engine::builder().local_host("127.0.0.1").build()?;
//! let initiator = Engine::builder().local_host("127.0.0.1").build()?;
//!
//! // The target publishes 1 MiB filled with a pattern.
//! let mut buf = HostBuffer::new(1 << 20)?;
//! buf.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8);
//! let published = target.register(buf, "*", Access::RemoteAccessible)?;
//!
//! // The initiator reads 64 KiB of it into its own registered memory.
//! let local = initiator.register(HostBuffer::new(1 << 16)?, "*", Access::LocalOnly)?;
//! let segment = initiator.open_segment(target.segment_name())?;
//! let remote = segment.buffers()?[0];
//!
//! let mut batch = initiator.batch(1)?;
//! batch.read(&local, 0, &segment, remote.addr, 1 << 16)?;
//! batch.submit()?;
//! batch.wait(None)?;
//! drop(batch);
//!
//! let got = local.to_vec();
//! assert!(got.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
//! # drop(published);
//! # Ok(())
//! # }
//! ```
//!
//! Notifications travel over the handshake port:
//!
//! ```
//! # use mooncake::Engine;
//! # fn main() -> mooncake::Result<()> {
//! let a = Engine::builder().build()?;
//! let b = Engine::builder().build()?;
//! let seg = b.open_segment(a.segment_name())?;
//! seg.notify("req-42", "kv-ready")?;
//! let got = a.notifications()?;
//! assert_eq!(got[0].message, "kv-ready");
//! # Ok(())
//! # }
//! ```
//!
//! # GPU memory
//!
//! With the `cuda12` or `cuda13` feature, device memory ([`gpu::DeviceBuffer`]
//! or, with the `cudarc` feature, a cudarc `CudaSlice<u8>`) registers and transfers like host memory;
//! see [`gpu`].
//!
//! # Logging
//!
//! Engine logs go to `tracing` under the target `mooncake::engine`; this
//! crate's own events use the target `mooncake`.
//!
//! # Raw access
//!
//! The C ABI is available as [`sys`] (the `mooncake-sys` crate).
#![deny(missing_docs)]
#![warn(unsafe_op_in_unsafe_fn)]

#[cfg(all(feature = "cudarc", not(any(feature = "cuda12", feature = "cuda13"))))]
compile_error!(
    "mooncake: the `cudarc` feature registers GPU memory and needs `cuda12` or `cuda13` as well"
);

mod batch;
mod config;
mod engine;
mod error;
mod ffi;
pub mod gpu;
#[cfg(test)]
mod layering;
mod memory;
mod notify;
pub mod rdma;
mod segment;
mod shared;

pub use batch::{Batch, Opcode, Statuses, TaskStatus};
pub use config::{EngineBuilder, GpuRegistration, Metadata, Protocol, TcpVersion};
pub use engine::{Engine, EngineCounters};
pub use error::{Error, ErrorCode, Result};
pub use memory::{
    Access, HostBuffer, LocalMemory, ManagedBuffer, RegisterableMemory, RegisteredSlice,
    Registration,
};
pub use mooncake_sys as sys;
pub use notify::Notification;
pub use rdma::{
    LinkLayer, NicCounters, NicLoad, NicPreference, RdmaCounters, RdmaDevice, RdmaTopology,
};
pub use segment::{RemoteBuffer, RemoteSegment};

/// The crate's README (what crates.io shows), compiled and run as a doctest
/// so its example cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctest;
