//! Bad input through the safe API: each gets a clear error naming the
//! cause, and the engine keeps serving afterwards.
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{engine, first_mismatch, patterned, SilentPeer};
use mooncake::{Access, Engine, Error, ErrorCode, HostBuffer, LocalMemory};

struct Pair {
    target: Engine,
    init: Engine,
    published: mooncake::Registration<HostBuffer>,
    local: mooncake::Registration<HostBuffer>,
    seg: mooncake::RemoteSegment,
}

fn pair() -> Pair {
    let target = engine();
    let init = engine();
    let published = target
        .register(patterned(1 << 20, 9), "*", Access::RemoteAccessible)
        .unwrap();
    let local = init
        .register(
            HostBuffer::new(1 << 20).unwrap(),
            "*",
            Access::RemoteAccessible,
        )
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    Pair {
        target,
        init,
        published,
        local,
        seg,
    }
}

impl Pair {
    /// A good transfer: the engines still serve.
    fn assert_serving(&self) {
        let mut b = self.init.batch(1).unwrap();
        b.read(&self.local, 0, &self.seg, self.published.addr(), 4096)
            .unwrap();
        b.submit().unwrap();
        b.wait(None).expect("engines still serve after bad input");
        drop(b);
        let mut got = vec![0u8; 4096];
        self.local.read_at(0, &mut got).unwrap();
        assert_eq!(first_mismatch(&got, 9, 0), None);
    }
}

#[test]
fn empty_memory_cannot_be_registered() {
    let e = engine();
    let err = HostBuffer::new(0).unwrap_err();
    assert!(err.to_string().contains("at least one byte"), "{err}");
    let err = e
        .register(Vec::<u8>::new(), "*", Access::LocalOnly)
        .unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
}

#[test]
fn requests_are_checked_before_submit() {
    let p = pair();
    let mut b = p.init.batch(2).unwrap();
    let e = b
        .read(&p.local, 0, &p.seg, p.published.addr(), 0)
        .unwrap_err();
    assert!(e.to_string().contains("at least one byte"), "{e}");
    let e = b
        .read(&p.local, (1 << 20) - 10, &p.seg, p.published.addr(), 11)
        .unwrap_err();
    assert!(e.to_string().contains("exceeds the registered"), "{e}");
    let e = b.read(&p.local, 0, &p.seg, u64::MAX - 3, 8).unwrap_err();
    assert!(e.to_string().contains("wraps"), "{e}");
    b.read(&p.local, 0, &p.seg, p.published.addr(), 8).unwrap();
    b.read(&p.local, 8, &p.seg, p.published.addr(), 8).unwrap();
    let e = b
        .read(&p.local, 16, &p.seg, p.published.addr(), 8)
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::TooManyRequests, "{e}");
    b.submit().unwrap();
    b.wait(None).unwrap();
    drop(b);

    // Memory or segments of another engine are refused.
    let other = engine();
    let foreign = other
        .register(HostBuffer::new(4096).unwrap(), "*", Access::LocalOnly)
        .unwrap();
    let foreign_seg = other.open_segment(p.target.segment_name()).unwrap();
    let mut b = p.init.batch(1).unwrap();
    let e = b
        .read(&foreign, 0, &p.seg, p.published.addr(), 8)
        .unwrap_err();
    assert!(e.to_string().contains("another engine"), "{e}");
    let e = b
        .read(&p.local, 0, &foreign_seg, p.published.addr(), 8)
        .unwrap_err();
    assert!(e.to_string().contains("another engine"), "{e}");
    drop(b);
    p.assert_serving();
}

#[test]
fn out_of_range_remote_requests_fail_with_the_reason() {
    let p = pair();
    let end = p.published.addr() + (1 << 20);
    for (write, addr, len) in [
        (false, end - 8, 16usize),
        (true, end - 8, 16),
        (false, 0x1000, 8),
        (true, 0x1000, 8),
    ] {
        let mut b = p.init.batch(1).unwrap();
        if write {
            b.write(&p.local, 0, &p.seg, addr, len).unwrap();
        } else {
            b.read(&p.local, 0, &p.seg, addr, len).unwrap();
        }
        b.submit().unwrap();
        match b.wait(None) {
            Err(Error::Transfer {
                failed: 1,
                total: 1,
                first_task: 0,
                message,
            }) => {
                assert!(message.contains("rejected"), "{message}");
            }
            other => panic!("expected a rejected transfer, got {other:?}"),
        }
        assert_eq!(b.transferred_bytes(0).unwrap(), 0);
        drop(b);
        p.assert_serving();
    }
    // Nothing was written by the rejected WRITEs.
    assert_eq!(first_mismatch(&p.published.to_vec(), 9, 0), None);
}

#[test]
fn unknown_and_unreachable_segments() {
    let e = Engine::builder()
        .handshake_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let err = e.open_segment("").unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    // An empty host fails name resolution without sending a DNS query.
    let err = e.open_segment(":15000").unwrap_err();
    assert_eq!(err.code(), ErrorCode::Dns, "{err}");
    assert!(err.to_string().contains("cannot resolve"), "{err}");
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = e.open_segment(&format!("127.0.0.1:{closed}")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Socket, "{err}");
    assert!(err.to_string().contains("refused"), "{err}");
    // A port that speaks another protocol and never answers the handshake:
    // our own TCP data port. Bounded by the handshake timeout.
    let t0 = Instant::now();
    let err = e
        .open_segment(&format!("127.0.0.1:{}", e.tcp_data_port()))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Socket, "{err}");
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(4));
    let err = e.open_segment("bad\0name").unwrap_err();
    assert!(err.to_string().contains("NUL"), "{err}");
}

#[test]
fn garbage_on_both_ports_leaves_the_engine_serving() {
    let p = pair();
    for port in [p.target.rpc_port(), p.target.tcp_data_port()] {
        for junk in [
            &b"\x00\x00\x00\x00\x00\x00\x00\x00"[..],
            b"\xff\xff\xff\xff\xff\xff\xff\x7fxx",
            b"GET / HTTP/1.1\r\n\r\n",
        ] {
            let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            // The engine may already have dropped us: write errors are fine.
            let _ = c.write_all(junk);
            let _ = c.shutdown(std::net::Shutdown::Write);
            let mut sink = Vec::new();
            let _ = c.read_to_end(&mut sink);
        }
    }
    p.seg.probe().unwrap();
    p.assert_serving();
}

/// An engine with a READ submitted to a peer that never answers.
struct HungTransfer {
    _peer: SilentPeer,
    engine: Engine,
    local: mooncake::Registration<HostBuffer>,
    seg: mooncake::RemoteSegment,
    remote_addr: u64,
}

impl HungTransfer {
    fn start(progress_timeout: Duration) -> Self {
        let peer = SilentPeer::start();
        let engine = Engine::builder()
            .tcp_progress_timeout(progress_timeout)
            .build()
            .unwrap();
        let local = engine
            .register(HostBuffer::new(4096).unwrap(), "*", Access::LocalOnly)
            .unwrap();
        let seg = engine.open_segment(&peer.segment_name).unwrap();
        let remote_addr = peer.buffer_addr;
        Self {
            _peer: peer,
            engine,
            local,
            seg,
            remote_addr,
        }
    }

    fn submit_read(&self) -> mooncake::Batch<'_> {
        let mut b = self.engine.batch(1).unwrap();
        b.read(&self.local, 0, &self.seg, self.remote_addr, 64)
            .unwrap();
        b.submit().unwrap();
        b
    }
}

#[test]
fn a_timed_out_wait_hands_the_batch_back() {
    let hung = HungTransfer::start(Duration::from_millis(1500));
    let mut b = hung.submit_read();
    match b.wait(Some(Duration::from_millis(100))) {
        Err(Error::Timeout(_)) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    // Still ours and still in flight; the progress timeout then fails it.
    let t0 = Instant::now();
    match b.wait(None) {
        Err(Error::Transfer { message, .. }) => assert!(message.contains("timed out"), "{message}"),
        other => panic!("expected the progress timeout, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn leaked_batch_cannot_outlive_the_memory() {
    // mem::forget ends a batch's borrows without waiting. The engine still
    // pins the local registration, so taking the memory back waits for the
    // transfer to end instead of freeing memory the engine may still write.
    let hung = HungTransfer::start(Duration::from_millis(1000));
    std::mem::forget(hung.submit_read());
    let t0 = Instant::now();
    let memory = hung.local.into_inner().unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(800),
        "into_inner returned while the transfer was in flight"
    );
    assert_eq!(memory.len(), 4096);
}

#[test]
fn dropping_a_batch_waits_for_its_transfers() {
    let p = pair();
    let mut local = p
        .init
        .register(HostBuffer::new(1 << 20).unwrap(), "*", Access::LocalOnly)
        .unwrap();
    {
        let mut b = p.init.batch(16).unwrap();
        for i in 0..16 {
            b.read(
                &local,
                i * 65536,
                &p.seg,
                p.published.addr() + (i * 65536) as u64,
                65536,
            )
            .unwrap();
        }
        b.submit().unwrap();
        // dropped here, without a wait
    }
    // Immediately idle: the drop waited.
    let bytes = local.local_slice_mut(Some(Duration::ZERO)).unwrap();
    assert_eq!(first_mismatch(bytes, 9, 0), None);
}

#[test]
fn remote_accessible_memory_is_never_lent_as_a_slice() {
    let p = pair();
    let mut published = p.published;
    let err = published.local_slice_mut(None).unwrap_err();
    assert!(err.to_string().contains("remote-accessible"), "{err}");
}
