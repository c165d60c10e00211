//! Two engines in one process moving real bytes over TCP on 127.0.0.1,
//! verified byte by byte.
mod common;

use common::{engine, engine_with, first_mismatch, pattern_byte, patterned};
use mooncake::{Access, HostBuffer, LocalMemory, TaskStatus};

const MIB: usize = 1 << 20;

#[test]
fn read_and_write_1_byte_to_64_mib() {
    let target = engine();
    let init = engine();
    let size = 64 * MIB + 8192;
    let mut published = target
        .register(patterned(size, 1), "*", Access::RemoteAccessible)
        .unwrap();
    let mut local = init
        .register(HostBuffer::new(size).unwrap(), "*", Access::LocalOnly)
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    let base = seg.buffers().unwrap()[0];
    assert_eq!(base.addr, published.addr());
    // "*" resolves to the NUMA node of the first page where NUMA is known.
    let loc = published.location().unwrap();
    assert!(loc.starts_with("cpu:") || loc == "*", "{loc}");

    for &len in &[1usize, 3, 4096, 65_535, 65_536, 65_537, MIB + 7, 64 * MIB] {
        // READ: poison, transfer, compare.
        local.fill(0xA5).unwrap();
        let remote_off = 11usize;
        {
            let mut b = init.batch(1).unwrap();
            b.read(&local, 0, &seg, base.addr + remote_off as u64, len)
                .unwrap();
            b.submit().unwrap();
            b.wait(None).unwrap();
            assert_eq!(b.status(0).unwrap(), TaskStatus::Completed);
            assert_eq!(b.transferred_bytes(0).unwrap(), len as u64);
        }
        let got = local.local_slice_mut(None).unwrap();
        assert_eq!(
            first_mismatch(&got[..len], 1, remote_off),
            None,
            "READ of {len} bytes"
        );
        assert_eq!(got[len], 0xA5, "READ of {len} bytes wrote past its end");

        // WRITE: fill the local side with another pattern, write, compare.
        for (i, b) in got[..len].iter_mut().enumerate() {
            *b = pattern_byte(2, i);
        }
        let dst_off = 4096usize;
        let after = {
            let mut one = [0u8];
            published.read_at(dst_off + len, &mut one).unwrap();
            one[0]
        };
        {
            let mut b = init.batch(1).unwrap();
            b.write(&local, 0, &seg, base.addr + dst_off as u64, len)
                .unwrap();
            b.submit().unwrap();
            b.wait(None).unwrap();
        }
        let mut back = vec![0u8; len + 1];
        published.read_at(dst_off, &mut back).unwrap();
        assert_eq!(
            first_mismatch(&back[..len], 2, 0),
            None,
            "WRITE of {len} bytes"
        );
        assert_eq!(back[len], after, "WRITE of {len} bytes wrote past its end");
        // Restore the target pattern for the next round.
        let restore: Vec<u8> = (0..len + 1).map(|i| pattern_byte(1, dst_off + i)).collect();
        published.write_at(dst_off, &restore).unwrap();
    }
}

#[test]
fn batches_of_1_to_1024_requests() {
    let target = engine();
    let init = engine();
    let block = 4096usize;
    let published = target
        .register(patterned(1024 * block, 3), "*", Access::RemoteAccessible)
        .unwrap();
    let mut local = init
        .register(
            HostBuffer::new(1024 * block).unwrap(),
            "*",
            Access::LocalOnly,
        )
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    let base = published.addr();
    for &n in &[1usize, 2, 31, 256, 1024] {
        local.fill(0).unwrap();
        {
            let mut b = init.batch(n).unwrap();
            // Reverse the block order: request i reads remote block n-1-i.
            for i in 0..n {
                b.read(
                    &local,
                    i * block,
                    &seg,
                    base + ((n - 1 - i) * block) as u64,
                    block,
                )
                .unwrap();
            }
            b.submit().unwrap();
            b.wait(None).unwrap();
            for i in 0..n {
                assert_eq!(b.status(i).unwrap(), TaskStatus::Completed);
            }
        }
        let got = local.local_slice_mut(None).unwrap();
        for i in 0..n {
            let chunk = &got[i * block..(i + 1) * block];
            assert_eq!(
                first_mismatch(chunk, 3, (n - 1 - i) * block),
                None,
                "batch {n}, request {i}"
            );
        }
    }
}

#[test]
fn many_threads_share_one_engine() {
    let target = engine();
    let init = engine();
    let threads = 8usize;
    let per = 32usize;
    let block = 16 * 1024usize;
    let total = threads * per * block;
    let published = target
        .register(patterned(total, 4), "*", Access::RemoteAccessible)
        .unwrap();
    let local = init
        .register(
            HostBuffer::new(total).unwrap(),
            "*",
            Access::RemoteAccessible,
        )
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    let base = published.addr();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (init, local, seg) = (&init, &local, &seg);
            s.spawn(move || {
                for round in 0..3 {
                    let mut b = init.batch(per).unwrap();
                    for i in 0..per {
                        let off = (t * per + i) * block;
                        b.read(local, off, seg, base + off as u64, block).unwrap();
                    }
                    b.submit().unwrap();
                    b.wait(None)
                        .unwrap_or_else(|e| panic!("thread {t} round {round}: {e}"));
                }
            });
        }
    });
    let got = local.to_vec();
    assert_eq!(first_mismatch(&got, 4, 0), None);
}

#[test]
fn borrowed_registration_round_trip() {
    let target = engine();
    let init = engine();
    let published = target
        .register(patterned(MIB, 5), "*", Access::RemoteAccessible)
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    let mut mine = vec![0u8; 8192];
    init.with_registered(&mut mine, Access::LocalOnly, |reg| {
        let mut b = init.batch(2).unwrap();
        b.read(reg, 0, &seg, published.addr() + 100, 4096).unwrap();
        b.read(reg, 4096, &seg, published.addr() + 200_000, 4096)
            .unwrap();
        b.submit().unwrap();
        b.wait(None).unwrap();
    })
    .unwrap();
    // The borrow is over and the buffer unregistered: plain access again.
    assert_eq!(first_mismatch(&mine[..4096], 5, 100), None);
    assert_eq!(first_mismatch(&mine[4096..], 5, 200_000), None);
    // Registering it again works, proving the first registration is gone.
    init.with_registered(&mut mine, Access::LocalOnly, |_| ())
        .unwrap();
}

#[test]
fn submitting_in_several_steps_and_notify() {
    let target = engine();
    let init = engine();
    let published = target
        .register(HostBuffer::new(MIB).unwrap(), "*", Access::RemoteAccessible)
        .unwrap();
    let local = init
        .register(patterned(MIB, 6), "*", Access::LocalOnly)
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    let mut b = init.batch(4).unwrap();
    b.write(&local, 0, &seg, published.addr(), 1000).unwrap();
    b.submit().unwrap();
    b.write(&local, 1000, &seg, published.addr() + 1000, 1000)
        .unwrap();
    b.write(&local, 2000, &seg, published.addr() + 2000, 1000)
        .unwrap();
    b.submit_with_notify("decode-0", "blocks-written").unwrap();
    assert_eq!(b.submitted(), 3);
    b.wait(None).unwrap();
    drop(b);
    let mut got = vec![0u8; 3000];
    published.read_at(0, &mut got).unwrap();
    assert_eq!(first_mismatch(&got, 6, 0), None);
    let notes = target.notifications().unwrap();
    assert_eq!(notes.len(), 1);
    assert_eq!(notes[0].name, "decode-0");
    assert_eq!(notes[0].message, "blocks-written");
    assert!(target.notifications().unwrap().is_empty());
}

#[test]
fn segment_refresh_sees_new_buffers_and_probe() {
    let target = engine();
    let init = engine();
    let _a = target
        .register(
            HostBuffer::new(4096).unwrap(),
            "*",
            Access::RemoteAccessible,
        )
        .unwrap();
    let _hidden = target
        .register(HostBuffer::new(4096).unwrap(), "*", Access::LocalOnly)
        .unwrap();
    let mut seg = init.open_segment(target.segment_name()).unwrap();
    assert_eq!(
        seg.buffers().unwrap().len(),
        1,
        "local-only buffers are not published"
    );
    assert_eq!(seg.protocol().unwrap(), "tcp");
    seg.probe().unwrap();
    let _b = target
        .register(
            HostBuffer::new(8192).unwrap(),
            "*",
            Access::RemoteAccessible,
        )
        .unwrap();
    assert_eq!(seg.buffers().unwrap().len(), 1, "cached descriptor");
    seg.refresh().unwrap();
    let bufs = seg.buffers().unwrap();
    assert_eq!(bufs.len(), 2);
    assert!(bufs.iter().any(|b| b.len == 8192));
}

#[test]
fn engine_settings_reach_the_engine() {
    use mooncake::{Engine, GpuRegistration};
    let e = Engine::builder()
        .device_allow_list(["mlx5_0", " mlx5_1 "])
        .device_deny_list(["mlx5_3"])
        .gpu_registration(GpuRegistration::DmaBuf)
        .build()
        .unwrap();
    assert_eq!(e.gpu_registration().unwrap(), GpuRegistration::DmaBuf);
    let (allow, deny) = e.device_filters().unwrap();
    assert_eq!(allow, ["mlx5_0", "mlx5_1"]);
    assert_eq!(deny, ["mlx5_3"]);
    // FromEnv resolves to upstream's default (peermem) without the variable.
    if std::env::var_os("WITH_NVIDIA_PEERMEM").is_none() {
        let d = Engine::builder().build().unwrap();
        assert_eq!(d.gpu_registration().unwrap(), GpuRegistration::PeerMem);
    }
}

/// Two engines of one process: the same-host path refuses them by design
/// (it serves only other processes; `tests/two_process.rs` covers it), so
/// whatever the switches say, TCP moves the bytes.
#[test]
fn same_host_path_is_refused_within_one_process() {
    for (target_on, init_on) in [(true, true), (true, false), (false, true)] {
        let target = engine_with(target_on);
        let init = engine_with(init_on);
        let published = target
            .register(patterned(4 * MIB, 7), "*", Access::RemoteAccessible)
            .unwrap();
        let mut local = init
            .register(HostBuffer::new(4 * MIB).unwrap(), "*", Access::LocalOnly)
            .unwrap();
        let seg = init.open_segment(target.segment_name()).unwrap();
        let base = seg.buffers().unwrap()[0].addr;
        let mut b = init.batch(2).unwrap();
        b.read(&local, 0, &seg, base + 3, MIB).unwrap();
        b.write(&local, 2 * MIB, &seg, base + 2 * MIB as u64, MIB)
            .unwrap();
        b.submit().unwrap();
        b.wait(None).unwrap();
        drop(b);
        let got = local.local_slice_mut(None).unwrap();
        assert_eq!(first_mismatch(&got[..MIB], 7, 3), None);
        let mut back = vec![0u8; MIB];
        published.read_at(2 * MIB, &mut back).unwrap();
        assert_eq!(back, got[2 * MIB..3 * MIB]);
        let c = init.counters().unwrap();
        assert_eq!((c.same_host_requests, c.tcp_requests_sent), (0, 2));
        assert_eq!(target.counters().unwrap().same_host_served, 0);
    }
}

#[test]
fn a_reset_batch_is_reused_round_after_round() {
    let target = engine_with(true);
    let init = engine_with(true);
    let _published = target
        .register(patterned(MIB, 9), "*", Access::RemoteAccessible)
        .unwrap();
    let mut local = init
        .register(HostBuffer::new(MIB).unwrap(), "*", Access::LocalOnly)
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    let base = seg.buffers().unwrap()[0].addr;
    {
        let mut b = init.batch(8).unwrap();
        for round in 0..50usize {
            for i in 0..8usize {
                let off = (round * 8 + i) % 256 * 4096;
                b.read(&local, off, &seg, base + off as u64, 4096).unwrap();
            }
            assert_eq!(b.queued(), 8);
            b.submit().unwrap();
            if round % 2 == 0 {
                b.wait(None).unwrap();
            }
            // Without a wait, reset waits for the transfers itself.
            b.reset().unwrap();
            assert_eq!((b.submitted(), b.queued()), (0, 0));
        }
        // Queued, never submitted requests are dropped by a reset.
        b.read(&local, 0, &seg, base, 4096).unwrap();
        b.reset().unwrap();
        assert_eq!(b.queued(), 0);
        // The batch still holds its full capacity.
        for i in 0..8u64 {
            b.read(&local, 0, &seg, base + i * 4096, 4096).unwrap();
        }
        assert!(b.read(&local, 0, &seg, base, 4096).is_err());
    }
    let got = local.local_slice_mut(None).unwrap();
    assert_eq!(first_mismatch(got, 9, 0), None);
}

/// Reading statuses stays linear in the batch size: a wait reads each
/// request's status once, and later per-request or whole-batch queries
/// answer from that copy. Before this guard the producer asked
/// `status(i)` for every `i`, and each call re-read the statuses of
/// requests `0..=i` (n²/2 reads for a batch of n).
#[test]
fn status_reads_are_linear_in_batch_size() {
    const N: usize = 20_000;
    const LEN: usize = 64;
    let target = engine();
    let init = engine();
    let published = target
        .register(patterned(N * LEN, 9), "*", Access::RemoteAccessible)
        .unwrap();
    let mut local = init
        .register(HostBuffer::new(N * LEN).unwrap(), "*", Access::LocalOnly)
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    let mut b = init.batch(N).unwrap();
    for i in 0..N {
        b.read(
            &local,
            i * LEN,
            &seg,
            published.addr() + (i * LEN) as u64,
            LEN,
        )
        .unwrap();
    }
    let before = init.counters().unwrap();
    b.submit().unwrap();
    b.wait(None).unwrap();
    for i in 0..N {
        assert_eq!(b.status(i).unwrap(), TaskStatus::Completed);
        assert_eq!(b.transferred_bytes(i).unwrap(), LEN as u64);
    }
    let all = b.statuses().unwrap();
    assert_eq!(all.len(), N);
    assert_eq!(all.not_completed().count(), 0);
    assert!(all.iter().all(|s| s == TaskStatus::Completed));
    let after = init.counters().unwrap();
    assert_eq!(after.tasks_submitted - before.tasks_submitted, N as u64);
    assert_eq!(
        after.task_status_reads - before.task_status_reads,
        N as u64,
        "one status read per request for wait + {N} status() + statuses()"
    );
    drop(b);
    let got = local.local_slice_mut(None).unwrap();
    assert_eq!(first_mismatch(got, 9, 0), None);

    // Before a wait, a per-request query costs one read, not a prefix.
    let mut b = init.batch(N).unwrap();
    for i in 0..N {
        b.read(
            &local,
            i * LEN,
            &seg,
            published.addr() + (i * LEN) as u64,
            LEN,
        )
        .unwrap();
    }
    b.submit().unwrap();
    let before = init.counters().unwrap();
    let probes = [0usize, N / 2, N - 1];
    for &i in &probes {
        b.status(i).unwrap();
    }
    let after = init.counters().unwrap();
    assert_eq!(
        after.task_status_reads - before.task_status_reads,
        probes.len() as u64
    );
    b.wait(None).unwrap();
}
