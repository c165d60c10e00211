//! Raw FFI to the mooncake-rs transfer engine.
//!
//! The engine is C++17 code of this project (the workspace's `vendor/`),
//! compiled by this crate's build script and linked statically. Its C ABI
//! mirrors upstream Mooncake's `transfer_engine_c.h` (same names, layouts,
//! constants and return conventions), plus `mooncake_ext.h` for what
//! upstream lacks. Everything here is `unsafe` to call; the `mooncake` crate
//! is the safe API.
//!
//! The bindings are pre-generated (`src/bindings.rs`); enable the `bindgen`
//! feature to regenerate them from the headers at build time
//! (`scripts/regen-bindings.sh` copies the result back).
#![no_std]
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]
#![deny(missing_docs)]

#[allow(missing_docs, clippy::all)]
mod bindings {
    #[cfg(feature = "bindgen")]
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
    #[cfg(not(feature = "bindgen"))]
    include!("bindings.rs");
}

pub use bindings::*;

/// `INVALID_BATCH` from the header (`UINT64_MAX`, which bindgen cannot
/// evaluate).
pub const INVALID_BATCH: u64 = u64::MAX;

/// The CUDA major this engine was built for (12 or 13), or 0 for a CPU
/// build (features `cuda12` / `cuda13`).
pub const CUDA_MAJOR: u32 = {
    let s = env!("MOONCAKE_CUDA_MAJOR").as_bytes();
    let mut v = 0u32;
    let mut i = 0;
    while i < s.len() {
        v = v * 10 + (s[i] - b'0') as u32;
        i += 1;
    }
    v
};

/// The committed bindings, for the freshness check of the `bindgen` feature.
#[doc(hidden)]
pub const COMMITTED_BINDINGS: &str = include_str!("bindings.rs");

/// The bindings generated from the headers in this build.
#[cfg(feature = "bindgen")]
#[doc(hidden)]
pub const GENERATED_BINDINGS: &str = include_str!(concat!(env!("OUT_DIR"), "/bindings.rs"));
