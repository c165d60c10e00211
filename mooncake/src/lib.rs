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
//!    buffers ([`RemoteSegment::buffers`]). A KV transfer, the same block
//!    ids in every layer's tensor, is one [`Batch::submit_blocks`] call with
//!    one [`BlockRegion`] per tensor: one task, checked per region and id.
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
//! # Async
//!
//! With the `async` feature (on by default), a batch's completion is a
//! future and notifications are a stream, for any executor (tokio,
//! smol, `futures::executor`). The rules differ from the blocking
//! [`Batch`] in one way: an [`AsyncBatch`] takes its local memory as an
//! [`Arc`](std::sync::Arc) and keeps a clone until every transfer that uses
//! it has ended, because a future can be dropped (a timeout, a cancelled
//! task) while the engine still moves bytes. Dropping the future does not
//! stop the transfers; dropping the batch while they run hands it and its
//! memory to the engine's reactor, which lets go of both when they end.
//! Completions are not polled: one reactor thread per engine waits on the
//! engine's eventfd and wakes exactly the futures whose batches finished.
//!
//! ```
//! use std::sync::Arc;
//! use mooncake::{Access, Engine, LocalMemory};
//!
//! # fn main() -> mooncake::Result<()> {
//! # futures::executor::block_on(async {
//! let target = Engine::builder().build()?;
//! let initiator = Engine::builder().build()?;
//! let published = target.register(vec![3u8; 4096], "*", Access::RemoteAccessible)?;
//! let peer = initiator.open_segment(target.segment_name())?;
//! let local = Arc::new(initiator.register(vec![0u8; 4096], "*", Access::LocalOnly)?);
//!
//! let mut batch = initiator.async_batch(1)?;
//! batch.read(&local, 0, &peer, published.addr(), 4096)?;
//! batch.run().await?; // no thread waits: the reactor wakes this task
//! drop(batch); // the batch's clone of `local` goes with it
//! assert!(local.to_vec().iter().all(|b| *b == 3));
//!
//! let mut incoming = target.notification_stream()?;
//! peer.notify("req-1", "done")?;
//! assert_eq!(incoming.recv().await?.message, "done");
//! # Ok(())
//! # })
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

#[cfg(feature = "async")]
mod async_batch;
mod batch;
mod blocks;
mod config;
mod engine;
mod error;
mod ffi;
pub mod gpu;
#[cfg(test)]
mod layering;
mod memory;
mod notify;
#[cfg(feature = "async")]
mod notify_stream;
pub mod rdma;
#[cfg(feature = "async")]
mod reactor;
mod segment;
#[cfg(feature = "async")]
mod segment_open;
mod shared;

#[cfg(feature = "async")]
pub use async_batch::{AsyncBatch, Completion};
pub use batch::{Batch, Opcode, Statuses, TaskStatus};
pub use blocks::BlockRegion;
pub use config::{EngineBuilder, GpuRegistration, Metadata, Protocol, TcpVersion};
pub use engine::{Engine, EngineCounters};
pub use error::{Error, ErrorCode, Result};
pub use memory::{
    Access, HostBuffer, LocalMemory, ManagedBuffer, RegisterableMemory, RegisteredSlice,
    Registration,
};
pub use mooncake_sys as sys;
pub use notify::Notification;
#[cfg(feature = "async")]
pub use notify_stream::NotificationStream;
pub use rdma::{
    LinkLayer, NicCounters, NicLoad, NicPreference, RdmaCounters, RdmaDevice, RdmaTopology,
};
pub use segment::{RemoteBuffer, RemoteSegment};
#[cfg(feature = "async")]
pub use segment_open::OpenSegment;

/// The crate's README (what crates.io shows), compiled and run as a doctest
/// so its example cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctest;
