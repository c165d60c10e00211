//! The engine's process-wide environment overrides, read by the engine's
//! own parser (`mc_get_env_overrides`) so that this crate reads no
//! environment variable itself.
use std::ffi::CStr;

use mooncake_sys as sys;

use super::engine::last_error;
use crate::error::{Error, ErrorCode, Result};

/// `MC_FORCE_TCP`, `MC_FORCE_HCA` and `MC_BIND_ADDRESS`, as the engine
/// reads them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EnvOverrides {
    /// `MC_FORCE_TCP` is set (any value): no RDMA, even for `Protocol::Auto`.
    pub(crate) force_tcp: bool,
    /// `MC_FORCE_HCA` is set (any value): `Protocol::Auto` must bring RDMA up.
    pub(crate) force_hca: bool,
    /// `MC_BIND_ADDRESS`, trimmed; `None` when unset or blank.
    pub(crate) bind_address: Option<String>,
}

/// The overrides the engine reads from the environment now.
pub(crate) fn env_overrides() -> Result<EnvOverrides> {
    let mut raw = sys::mc_env_overrides_t {
        struct_size: std::mem::size_of::<sys::mc_env_overrides_t>() as u32,
        ..Default::default()
    };
    // SAFETY: `raw` is a valid, writable struct whose `struct_size` says how
    // large it is; the engine writes only inside it.
    let rc = unsafe { sys::mc_get_env_overrides(&mut raw) };
    if rc != 0 {
        return Err(last_error(rc));
    }
    // The engine NUL-terminates `bind_address`; a missing terminator would
    // be an engine bug, reported rather than read past.
    let bytes: Vec<u8> = raw.bind_address.iter().map(|&c| c as u8).collect();
    let addr = CStr::from_bytes_until_nul(&bytes)
        .map_err(|_| Error::Engine {
            code: ErrorCode::Internal,
            message: "mc_get_env_overrides: bind_address is not NUL-terminated".into(),
        })?
        .to_str()
        .map_err(|_| Error::InvalidArgument("MC_BIND_ADDRESS is not UTF-8".into()))?;
    Ok(EnvOverrides {
        force_tcp: raw.force_tcp != 0,
        force_hca: raw.force_hca != 0,
        bind_address: (!addr.is_empty()).then(|| addr.to_string()),
    })
}
