//! The async API on tokio: batches whose completion is a future, woken by
//! the engine's reactor; futures dropped mid-flight (the memory stays held
//! until the transfers end); notifications as a stream. Two engines in one
//! process over TCP on 127.0.0.1, every byte checked.
#![cfg(feature = "async")]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{engine, first_mismatch, patterned};
use futures::StreamExt;
use mooncake::{Access, Error, HostBuffer, LocalMemory, TaskStatus};

const MIB: usize = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_concurrent_reads_complete_and_verify() {
    let target = engine();
    let init = engine();
    let size = 8 * MIB;
    let published = target
        .register(patterned(size, 3), "*", Access::RemoteAccessible)
        .unwrap();
    let seg = Arc::new(init.open_segment(target.segment_name()).unwrap());
    let local = Arc::new(
        init.register(HostBuffer::new(size).unwrap(), "*", Access::LocalOnly)
            .unwrap(),
    );
    let base = published.addr();
    let blocks = size / 4096;
    let mut tasks = Vec::new();
    for b in 0..blocks {
        let (init, seg, local) = (init.clone(), seg.clone(), local.clone());
        tasks.push(tokio::spawn(async move {
            let mut batch = init.async_batch(1)?;
            let off = b * 4096;
            batch.read(&local, off, &seg, base + off as u64, 4096)?;
            batch.run().await?;
            assert_eq!(batch.statuses()?.get(0), Some(TaskStatus::Completed));
            Ok::<_, Error>(())
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let local = Arc::try_unwrap(local).expect("every batch let go of the memory");
    assert_eq!(first_mismatch(&local.to_vec(), 3, 0), None);
}

/// A future dropped while its transfer runs, and its batch with it: the
/// transfer goes on, the memory stays held (by the reactor) until it ends,
/// then is let go; the bytes that arrive are the right ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_future_and_batch_hold_memory_until_the_transfer_ends() {
    let target = engine();
    let init = engine();
    let size = 64 * MIB;
    let published = target
        .register(patterned(size, 5), "*", Access::RemoteAccessible)
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    // The READ lands between two guard pages of the same registration
    // (zeroed): they must stay untouched.
    const GUARD: usize = 4096;
    let local = Arc::new(
        init.register(
            HostBuffer::new(size + 2 * GUARD).unwrap(),
            "*",
            Access::LocalOnly,
        )
        .unwrap(),
    );
    let mut batch = init.async_batch(1).unwrap();
    batch
        .read(&local, GUARD, &seg, published.addr(), size)
        .unwrap();
    {
        let fut = batch.run();
        drop(fut); // before its first poll: the READ is already under way
    }
    drop(batch);
    let t0 = Instant::now();
    let mut held_while_running = false;
    while Arc::strong_count(&local) > 1 {
        held_while_running = true;
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the reactor never let go of the memory"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The drop came microseconds after the submit of a 64 MiB READ: the
    // reactor must have been holding the memory then.
    assert!(
        held_while_running,
        "the memory was let go while the READ ran"
    );
    let local = Arc::try_unwrap(local).expect("let go").to_vec();
    assert_eq!(first_mismatch(&local[GUARD..GUARD + size], 5, 0), None);
    assert!(
        local[..GUARD].iter().all(|b| *b == 0),
        "bytes before the buffer changed"
    );
    assert!(
        local[GUARD + size..].iter().all(|b| *b == 0),
        "bytes after the buffer changed"
    );
    eprintln!(
        "memory held by the reactor after the drop: {held_while_running}, released after {:?}",
        t0.elapsed()
    );
}

/// A timeout drops the future; awaiting `run` again (nothing new queued)
/// learns how the transfers ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_then_await_again() {
    let target = engine();
    let init = engine();
    let size = 64 * MIB;
    let published = target
        .register(patterned(size, 7), "*", Access::RemoteAccessible)
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    let local = Arc::new(
        init.register(HostBuffer::new(size).unwrap(), "*", Access::LocalOnly)
            .unwrap(),
    );
    let mut batch = init.async_batch(4).unwrap();
    for i in 0..4 {
        let q = size / 4;
        batch
            .read(&local, i * q, &seg, published.addr() + (i * q) as u64, q)
            .unwrap();
    }
    let first = tokio::time::timeout(Duration::from_micros(1), batch.run()).await;
    if first.is_ok() {
        eprintln!("the reads finished within 1 µs of their first poll");
    }
    batch.run().await.unwrap();
    assert!(batch
        .statuses()
        .unwrap()
        .iter()
        .all(|s| s == TaskStatus::Completed));
    batch.reset().unwrap();
    drop(batch);
    let local = Arc::try_unwrap(local).expect("reset let go");
    assert_eq!(first_mismatch(&local.to_vec(), 7, 0), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_request_is_a_transfer_error_naming_it() {
    let target = engine();
    let init = engine();
    let published = target
        .register(vec![1u8; 8192], "*", Access::RemoteAccessible)
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    let local = Arc::new(
        init.register(vec![0u8; 8192], "*", Access::LocalOnly)
            .unwrap(),
    );
    let mut batch = init.async_batch(2).unwrap();
    batch.read(&local, 0, &seg, published.addr(), 4096).unwrap();
    // Past the end of the peer's buffer.
    batch
        .read(&local, 4096, &seg, published.addr() + 8192, 4096)
        .unwrap();
    match batch.run().await {
        Err(Error::Transfer {
            failed: 1,
            total: 2,
            first_task: 1,
            message,
        }) => assert!(!message.is_empty()),
        other => panic!("expected a transfer error, got {other:?}"),
    }
    assert!(batch.reset().is_ok());
    // Memory of another engine, and a full batch, are refused up front.
    let other = engine();
    let foreign = Arc::new(
        other
            .register(vec![0u8; 64], "*", Access::LocalOnly)
            .unwrap(),
    );
    let e = batch
        .read(&foreign, 0, &seg, published.addr(), 64)
        .unwrap_err();
    assert!(e.to_string().contains("another engine"), "{e}");
    let mut one = init.async_batch(1).unwrap();
    one.read(&local, 0, &seg, published.addr(), 64).unwrap();
    assert!(one.read(&local, 64, &seg, published.addr(), 64).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_arrive_as_a_stream_in_order() {
    let decode = engine();
    let prefill = engine();
    let mut stream = decode.notification_stream().unwrap();
    let waiter = tokio::spawn(async move {
        let mut got = Vec::new();
        while got.len() < 3 {
            got.push(stream.next().await.unwrap().unwrap().message);
        }
        got
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let peer = prefill.open_segment(decode.segment_name()).unwrap();
    for m in ["one", "two", "three"] {
        peer.notify("req", m).unwrap();
    }
    let got = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the stream was woken")
        .unwrap();
    assert_eq!(got, ["one", "two", "three"]);
}

/// A waker whose `wake` drops the task it belongs to (what a shut-down
/// executor, or a cancelled task whose last reference is the waker, does).
struct DropOnWake {
    fut: std::sync::Mutex<Option<Fut>>,
    woke: std::sync::atomic::AtomicBool,
}

type Fut = std::pin::Pin<Box<dyn std::future::Future<Output = mooncake::Result<()>> + Send>>;

impl std::task::Wake for DropOnWake {
    fn wake(self: Arc<Self>) {
        let f = self.fut.lock().unwrap().take();
        drop(f); // Completion's drop stops watching its batch: a reactor lock
        self.woke.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The reactor wakes with none of its locks held: a waker that drops its
/// future (whose drop takes a reactor lock) does not deadlock it, and later
/// batches still complete.
#[test]
fn a_waker_that_drops_its_future_does_not_stall_the_reactor() {
    use std::sync::atomic::Ordering;
    use std::task::{Context, Poll, Waker};
    let target = engine();
    let init = engine();
    let size = 128 * MIB;
    let published = target
        .register(patterned(size, 9), "*", Access::RemoteAccessible)
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    let local = Arc::new(
        init.register(HostBuffer::new(size).unwrap(), "*", Access::LocalOnly)
            .unwrap(),
    );
    // Leaked so that its future is 'static and can live inside the waker.
    let batch: &'static mut mooncake::AsyncBatch =
        Box::leak(Box::new(init.async_batch(1).unwrap()));
    batch.read(&local, 0, &seg, published.addr(), size).unwrap();
    let dw = Arc::new(DropOnWake {
        fut: std::sync::Mutex::new(None),
        woke: std::sync::atomic::AtomicBool::new(false),
    });
    let waker = Waker::from(dw.clone());
    let mut fut: Fut = Box::pin(batch.run());
    match fut.as_mut().poll(&mut Context::from_waker(&waker)) {
        Poll::Ready(r) => {
            eprintln!("the 128 MiB READ ended at the first poll ({r:?}): nothing to check");
            return;
        }
        Poll::Pending => {}
    }
    *dw.fut.lock().unwrap() = Some(fut);
    drop(waker);
    let t0 = Instant::now();
    while !dw.woke.load(Ordering::SeqCst) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the reactor never returned from wake()"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The reactor still serves the engine.
    let small = Arc::new(
        init.register(vec![0u8; 4096], "*", Access::LocalOnly)
            .unwrap(),
    );
    let mut again = init.async_batch(1).unwrap();
    again.read(&small, 0, &seg, published.addr(), 4096).unwrap();
    futures::executor::block_on(again.run()).unwrap();
}

/// Opening a segment from async code: the handshake runs off the runtime;
/// a peer that is not there is a clear error, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_open_from_async_code() {
    let target = engine();
    let init = engine();
    let _published = target
        .register(vec![4u8; 4096], "*", Access::RemoteAccessible)
        .unwrap();
    let peer = init
        .open_segment_async(target.segment_name())
        .unwrap()
        .await
        .unwrap();
    assert_eq!(peer.buffers().unwrap().len(), 1);
    // A port on 127.0.0.1 where nothing listens.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t0 = Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(20),
        init.open_segment_async(&format!("127.0.0.1:{free}"))
            .unwrap(),
    )
    .await
    .expect("bounded by the handshake timeouts")
    .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(20));
    eprintln!(
        "open of a closed port failed after {:?}: {err}",
        t0.elapsed()
    );
    assert!(!err.to_string().is_empty());
}
