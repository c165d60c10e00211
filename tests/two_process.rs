//! Our engine in two processes: the scenario across a process boundary in
//! both roles, and a peer that dies mid-transfer.
mod support;

use std::time::{Duration, Instant};

use mooncake::{Access, Engine, Error, HostBuffer};
use support::{cross_scenario, Kind, PeerProc};

#[test]
fn ours_to_ours_across_processes() {
    let mut target = PeerProc::spawn(Kind::Ours, 16 << 20, 51);
    let mut init = PeerProc::spawn(Kind::Ours, 16 << 20, 52);
    cross_scenario(&mut init, &mut target, 51);
}

#[test]
fn ours_to_ours_across_processes_over_tcp() {
    let off = ["--same-host", "off"];
    let mut target = PeerProc::spawn_with(Kind::Ours, 16 << 20, 53, &off);
    let mut init = PeerProc::spawn_with(Kind::Ours, 16 << 20, 54, &off);
    cross_scenario(&mut init, &mut target, 53);
}

#[test]
fn same_host_path_between_processes_and_its_switch() {
    use mooncake_connector::testkit::{check_pattern, fill_pattern};
    let mut target = PeerProc::spawn(Kind::Ours, 16 << 20, 65);
    for on in [true, false] {
        let engine = Engine::builder().same_host_path(on).build().unwrap();
        let mut local = engine
            .register(HostBuffer::new(16 << 20).unwrap(), "*", Access::LocalOnly)
            .unwrap();
        let seg = engine.open_segment(&target.segment).unwrap();
        let mut b = engine.batch(1).unwrap();
        b.read(&local, 0, &seg, target.addr, 16 << 20).unwrap();
        b.submit().unwrap();
        b.wait(None).unwrap();
        drop(b);
        assert_eq!(check_pattern(&local.to_vec(), 65, 0), None);
        // 256 scattered 4 KiB WRITEs of another pattern.
        fill_pattern(local.local_slice_mut(None).unwrap(), 66, 0);
        let mut b = engine.batch(256).unwrap();
        for i in 0..256usize {
            b.write(
                &local,
                i * 4096,
                &seg,
                target.addr + (i * 4096) as u64,
                4096,
            )
            .unwrap();
        }
        b.submit().unwrap();
        b.wait(None).unwrap();
        drop(b);
        target.ok("check 0 1048576 66 0");
        target.ok("fill 0 1048576 65");
        let c = engine.counters().unwrap();
        if on {
            assert_eq!((c.same_host_requests, c.tcp_requests_sent), (257, 0));
        } else {
            assert_eq!((c.same_host_requests, c.tcp_requests_sent), (0, 257));
        }
    }
}

#[test]
fn in_process_engine_and_peer_process_64_mib() {
    use mooncake_connector::testkit::check_pattern;
    let mut target = PeerProc::spawn(Kind::Ours, 64 << 20, 61);
    let engine = Engine::builder().build().unwrap();
    let local = engine
        .register(
            HostBuffer::new(64 << 20).unwrap(),
            "*",
            Access::RemoteAccessible,
        )
        .unwrap();
    let seg = engine.open_segment(&target.segment).unwrap();
    let mut b = engine.batch(1).unwrap();
    b.read(&local, 0, &seg, target.addr, 64 << 20).unwrap();
    b.submit().unwrap();
    b.wait(None).unwrap();
    drop(b);
    assert_eq!(check_pattern(&local.to_vec(), 61, 0), None);
    // A batch of 1024 requests across the process boundary.
    let block = 16 * 1024;
    let mut b = engine.batch(1024).unwrap();
    for i in 0..1024usize {
        let remote = target.addr + ((1023 - i) * block) as u64;
        b.write(&local, i * block, &seg, remote, block).unwrap();
    }
    b.submit().unwrap();
    b.wait(None).unwrap();
    drop(b);
    for i in [0usize, 1, 511, 1023] {
        target.ok(&format!(
            "check {} {block} 61 {}",
            (1023 - i) * block,
            i * block
        ));
    }
    // And the peer process writes 64 MiB into us.
    let me = engine.segment_name().to_string();
    let addr = mooncake::LocalMemory::addr(&local);
    target.ok("fill 0 67108864 62");
    target.ok(&format!("write {me} {addr} 0 67108864"));
    assert_eq!(check_pattern(&local.to_vec(), 62, 0), None);
}

#[test]
fn peer_killed_mid_transfer_fails_in_bounded_time() {
    let mut target = PeerProc::spawn(Kind::Ours, 256 << 20, 71);
    let engine = Engine::builder()
        .tcp_progress_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let local = engine
        .register(HostBuffer::new(256 << 20).unwrap(), "*", Access::LocalOnly)
        .unwrap();
    let seg = engine.open_segment(&target.segment).unwrap();
    // Many large requests in both directions, then SIGKILL the target.
    for round in 0..2 {
        let mut b = engine.batch(64).unwrap();
        for i in 0..64usize {
            let off = i * (4 << 20);
            if i % 2 == 0 {
                b.read(&local, off, &seg, target.addr + off as u64, 4 << 20)
                    .unwrap();
            } else {
                b.write(&local, off, &seg, target.addr + off as u64, 4 << 20)
                    .unwrap();
            }
        }
        b.submit().unwrap();
        if round == 1 {
            std::thread::sleep(Duration::from_millis(20));
            target.kill();
        }
        let t0 = Instant::now();
        let r = b.wait(None);
        if round == 0 {
            r.expect("transfers before the kill succeed");
            continue;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "took {:?}",
            t0.elapsed()
        );
        match r {
            Err(Error::Transfer { failed, .. }) => assert!(failed > 0),
            Ok(()) => panic!("every transfer finished before the kill; the test proves nothing"),
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    // Later transfers to the dead segment fail fast instead of hanging.
    let mut b = engine.batch(1).unwrap();
    b.read(&local, 0, &seg, target.addr, 4096).unwrap();
    b.submit().unwrap();
    let t0 = Instant::now();
    assert!(matches!(b.wait(None), Err(Error::Transfer { .. })));
    assert!(t0.elapsed() < Duration::from_secs(10));
}
