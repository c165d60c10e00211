//! Interoperability with the upstream engine (PyPI
//! `mooncake-transfer-engine-non-cuda==0.3.13.post1`, TCP over
//! P2PHANDSHAKE on 127.0.0.1), in both directions.
//!
//! Whether the upstream engine is installed is known only at run time, so
//! this file has its own `main` (libtest-mimic): without it these tests are
//! reported as *ignored*, not passed (see `support::upstream_trial`).
mod support;

use libtest_mimic::Arguments;
use support::{cross_scenario, upstream_trial, Kind, PeerProc};

fn main() {
    let args = Arguments::from_args();
    let tests = vec![
        upstream_trial(
            "our_initiator_against_upstream_target",
            our_initiator_against_upstream_target,
        ),
        upstream_trial(
            "upstream_initiator_against_our_target",
            upstream_initiator_against_our_target,
        ),
        upstream_trial(
            "upstream_against_upstream_baseline",
            upstream_against_upstream_baseline,
        ),
        upstream_trial(
            "safe_api_in_process_against_upstream_target",
            safe_api_in_process_against_upstream_target,
        ),
    ];
    libtest_mimic::run(&args, tests).exit();
}

fn our_initiator_against_upstream_target() {
    let mut target = PeerProc::spawn(Kind::Upstream, 16 << 20, 11);
    let mut init = PeerProc::spawn(Kind::Ours, 16 << 20, 12);
    cross_scenario(&mut init, &mut target, 11);
}

fn upstream_initiator_against_our_target() {
    let mut target = PeerProc::spawn(Kind::Ours, 16 << 20, 21);
    let mut init = PeerProc::spawn(Kind::Upstream, 16 << 20, 22);
    cross_scenario(&mut init, &mut target, 21);
}

fn upstream_against_upstream_baseline() {
    // The scenario itself, checked against upstream on both sides: if this
    // fails, the scenario (not our engine) is wrong.
    let mut target = PeerProc::spawn(Kind::Upstream, 16 << 20, 31);
    let mut init = PeerProc::spawn(Kind::Upstream, 16 << 20, 32);
    cross_scenario(&mut init, &mut target, 31);
}

fn safe_api_in_process_against_upstream_target() {
    use mooncake::{Access, Engine, HostBuffer};
    use mooncake_connector::testkit::check_pattern;
    let mut target = PeerProc::spawn(Kind::Upstream, 4 << 20, 41);
    let engine = Engine::builder().build().unwrap();
    let local = engine
        .register(HostBuffer::new(4 << 20).unwrap(), "*", Access::LocalOnly)
        .unwrap();
    let seg = engine.open_segment(&target.segment).unwrap();
    let bufs = seg.buffers().unwrap();
    assert_eq!(bufs.len(), 1);
    assert_eq!(bufs[0].addr, target.addr);
    assert_eq!(bufs[0].len, 4 << 20);
    assert_eq!(seg.protocol().unwrap(), "tcp");
    let mut b = engine.batch(64).unwrap();
    for i in 0..64usize {
        b.read(
            &local,
            i * 65536,
            &seg,
            target.addr + (i * 65536) as u64,
            65536,
        )
        .unwrap();
    }
    b.submit().unwrap();
    b.wait(None).unwrap();
    drop(b);
    assert_eq!(check_pattern(&local.to_vec(), 41, 0), None);
    seg.probe().unwrap();
    // Direct notify (genNotifyInEngine) into upstream's queue.
    seg.notify("rust-side", "hello").unwrap();
    let notes = target.ok("notifs");
    assert!(
        notes.contains("\"rust-side\"") && notes.contains("\"hello\""),
        "{notes}"
    );
}
