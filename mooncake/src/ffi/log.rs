//! Routes the engine's log lines into `tracing` (target `mooncake::engine`).
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Once;

use mooncake_sys as sys;

extern "C" fn sink(_user: *mut c_void, level: c_int, message: *const c_char) {
    // Never unwind into C++.
    let _ = std::panic::catch_unwind(|| {
        if message.is_null() {
            return;
        }
        // SAFETY: the engine passes a NUL-terminated string that lives for
        // the duration of this call.
        let msg = unsafe { CStr::from_ptr(message) }.to_string_lossy();
        match level {
            0 => tracing::trace!(target: "mooncake::engine", "{msg}"),
            1 => tracing::debug!(target: "mooncake::engine", "{msg}"),
            2 => tracing::info!(target: "mooncake::engine", "{msg}"),
            3 => tracing::warn!(target: "mooncake::engine", "{msg}"),
            _ => tracing::error!(target: "mooncake::engine", "{msg}"),
        }
    });
}

/// Installs the sink once per process. The engine formats messages at
/// DEBUG and above; `tracing`'s filters decide what is kept.
pub(crate) fn install_log_sink() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: `sink` is a valid `extern "C"` function for the whole
        // program and ignores its user pointer.
        let rc = unsafe {
            sys::mc_set_log_sink(Some(sink), std::ptr::null_mut(), sys::MC_LOG_DEBUG as c_int)
        };
        if rc != 0 {
            tracing::warn!(target: "mooncake", rc, "could not install the engine log sink");
        }
    });
}
