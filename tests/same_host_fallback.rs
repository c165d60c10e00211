//! When the same-host path cannot be used between the two processes
//! (another user: refused on both sides of the Unix socket; ptrace rules
//! forbid the target to attach to us: refused by the target before its
//! greeting), it falls back to TCP and every transfer still completes.
//!
//! Its own test binary: when not run as root it makes this process
//! non-dumpable, which other tests must not see. Whether the test can run
//! is known only at run time (as root, the peer binary must be executable
//! by another user), so the binary has its own `main` (libtest-mimic): when
//! it cannot, the test is reported as *ignored* with the reason on stderr,
//! not as passed.
mod support;

use libtest_mimic::{Arguments, Trial};
use mooncake::{Access, Engine, HostBuffer};
use mooncake_connector::testkit::{check_pattern, fill_pattern};
use support::{Kind, PeerProc};

const NAME: &str = "refused_cross_memory_attach_falls_back_to_tcp";

fn main() {
    let args = Arguments::from_args();
    let mut test = Trial::test(NAME, || {
        refused_cross_memory_attach_falls_back_to_tcp();
        Ok(())
    });
    if running_as_root()
        && !others_may_run(std::path::Path::new(env!("CARGO_BIN_EXE_mooncake-peer")))
    {
        eprintln!(
            "skipped {NAME}: the peer binary is not executable by other users here \
             (a private build directory)"
        );
        test = test.with_ignored_flag(true);
    }
    libtest_mimic::run(&args, vec![test]).exit();
}

fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn refused_cross_memory_attach_falls_back_to_tcp() {
    let mut target = if running_as_root() {
        // As another user, the target may not attach to this (root) process.
        PeerProc::spawn_as(Kind::Ours, 4 << 20, 71, &[], Some(65534))
    } else {
        // Not dumpable: a process of our user without CAP_SYS_PTRACE may not
        // attach to us.
        // SAFETY: prctl(PR_SET_DUMPABLE) only changes this process's flag.
        let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
        assert_eq!(rc, 0);
        PeerProc::spawn(Kind::Ours, 4 << 20, 71)
    };
    let engine = Engine::builder().build().unwrap(); // same-host path on
    let mut local = engine
        .register(HostBuffer::new(4 << 20).unwrap(), "*", Access::LocalOnly)
        .unwrap();
    let seg = engine.open_segment(&target.segment).unwrap();
    let mut b = engine.batch(2).unwrap();
    b.read(&local, 0, &seg, target.addr, 1 << 20).unwrap();
    b.submit().unwrap();
    b.wait(None).unwrap();
    drop(b);
    assert_eq!(check_pattern(&local.to_vec()[..1 << 20], 71, 0), None);
    fill_pattern(&mut local.local_slice_mut(None).unwrap()[..1 << 20], 72, 0);
    let mut b = engine.batch(1).unwrap();
    b.write(&local, 0, &seg, target.addr + (2 << 20), 1 << 20)
        .unwrap();
    b.submit().unwrap();
    b.wait(None).unwrap();
    drop(b);
    target.ok(&format!("check {} {} 72 0", 2 << 20, 1 << 20));
    let c = engine.counters().unwrap();
    assert_eq!(c.same_host_requests, 0, "{c:?}");
    assert_eq!(c.tcp_requests_sent, 2, "{c:?}");
}

/// Whether a user other than the owner may execute `bin` (every directory
/// on its path searchable, the file executable, by others).
fn others_may_run(bin: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let Ok(bin) = bin.canonicalize() else {
        return false;
    };
    bin.ancestors().all(|p| {
        std::fs::metadata(p)
            .map(|m| m.permissions().mode() & 0o001 != 0)
            .unwrap_or(false)
    })
}
