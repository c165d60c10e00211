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
mod env;
mod extras;
mod gpu;
mod host_alloc;
mod log;
mod memory;
#[cfg(feature = "async")]
mod poll;

pub(crate) use engine::{engine_version, OwnedCString, RawEngine, RequestBuf};
pub(crate) use env::env_overrides;
pub(crate) use gpu::{dmabuf_export as gpu_dmabuf_export, query as gpu_query, DeviceAlloc};
pub(crate) use host_alloc::{page_size, PageAlignedAlloc};
pub(crate) use log::install_log_sink;
pub(crate) use memory::{device_copy_in, device_copy_out};
pub(crate) use memory::{BorrowedRegion, OwnedRegion};
pub use memory::{RegisterableMemory, RegisteredRegion};
#[cfg(feature = "async")]
pub(crate) use poll::{drain_eventfd, wait_either, EventFd};

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use mooncake_sys as sys;

    use crate::error::ErrorCode;

    /// `ErrorCode::engine_name` keeps its own table so that `error` needs no
    /// FFI call; it must agree with the engine's.
    #[test]
    fn error_names_match_the_engine() {
        for raw in [
            -1, -2, -3, -4, -6, -7, -101, -102, -103, -104, -200, -201, -202, -300, -301, -302,
            -303, -1001, -1002, -1003, -1004, -1005,
        ] {
            // SAFETY: returns a pointer to a static NUL-terminated string.
            let engine = unsafe { CStr::from_ptr(sys::mc_error_name(raw)) };
            let code = ErrorCode::from_raw(raw);
            assert_eq!(engine.to_str().ok(), Some(code.engine_name()), "{raw}");
        }
    }
}
