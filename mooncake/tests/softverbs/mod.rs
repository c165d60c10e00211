//! Builds the softverbs stand-in (vendor/softverbs: a software verbs
//! provider the engine loads in place of libibverbs, since no machine here
//! has an RDMA NIC). Shared by the mooncake crate's tests and, through
//! `#[path]`, by the root package's tests.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `make -C vendor softverbs` into the test tmpdir and returns the
/// path of the library to put in `MC_VERBS_LIBRARY`. The `env!`s expand in
/// the crate that includes this file; `vendor/` is found above its
/// manifest directory.
pub fn build_softverbs() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let vendor = manifest
        .ancestors()
        .map(|d| d.join("vendor"))
        .find(|v| v.join("Makefile").is_file())
        .expect("vendor/Makefile above the crate");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("softverbs");
    let status = Command::new("make")
        .arg("-C")
        .arg(&vendor)
        .arg(format!("BUILD={}", out.display()))
        .arg("softverbs")
        .status()
        .expect("run make (needed to build the softverbs stand-in)");
    assert!(status.success(), "make softverbs failed");
    out.join("libmc_softverbs.so")
}
