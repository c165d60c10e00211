//! The thin FFI layer: every `unsafe` block of this crate lives under this
//! module, each with the reason it is sound. The rest of the crate builds
//! the safe API on these few primitives.
//!
//! Invariants the rest of the crate relies on:
//! - A [`RawEngine`] owns one engine handle and destroys it exactly once.
//! - A [`RegisteredRegion`] exists only for memory that stays valid and
//!   unmoved until the region is unregistered (its `Drop`), and
//!   unregistering blocks inside the engine until no transfer, ours or a
//!   peer's, touches the memory. That is what makes submitting raw pointers
//!   to registered memory sound even when a batch is leaked.

mod engine;
mod gpu;
mod log;
mod memory;

pub(crate) use engine::{engine_version, error_name, OwnedCString, RawEngine, RequestBuf};
pub(crate) use gpu::{dmabuf_export as gpu_dmabuf_export, query as gpu_query, DeviceAlloc};
pub(crate) use log::install_log_sink;
pub use memory::RegisteredRegion;
pub(crate) use memory::{device_copy_in, device_copy_out};
pub(crate) use memory::{page_size, BorrowedRegion, OwnedRegion, PageAlignedAlloc};
