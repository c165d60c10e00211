//! The hot path of the safe API allocates nothing: once a batch exists,
//! queuing, submitting, waiting and resetting it (TCP and same-host) make
//! no Rust allocation on the calling thread. (The engine's own C++ hot path
//! is checked by `vendor/tests/test_alloc.cpp`.)
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::{engine_with, patterned};
use mooncake::{Access, Batch, HostBuffer, Registration, RemoteSegment};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: thread-locals may be gone while a thread exits.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        }
    });
}

// SAFETY: forwards every call to the system allocator unchanged; it only
// counts, in thread-local cells that allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn counted<R>(f: impl FnOnce() -> R) -> (R, u64) {
    COUNT.with(|c| c.set(0));
    COUNTING.with(|on| on.set(true));
    let r = f();
    COUNTING.with(|on| on.set(false));
    (r, COUNT.with(|c| c.get()))
}

fn round<'r>(
    batch: &mut Batch<'r>,
    local: &'r Registration<HostBuffer>,
    seg: &RemoteSegment,
    base: u64,
) {
    for i in 0..32usize {
        let off = i * 4096;
        if i % 2 == 0 {
            batch
                .read(local, off, seg, base + off as u64, 4096)
                .unwrap();
        } else {
            batch
                .write(local, off, seg, base + off as u64, 4096)
                .unwrap();
        }
    }
    batch.submit().unwrap();
    batch.wait(None).unwrap();
    batch.reset().unwrap();
}

#[test]
fn queue_submit_wait_reset_allocate_nothing() {
    for same_host in [false, true] {
        let target = engine_with(same_host);
        let init = engine_with(same_host);
        let _published = target
            .register(patterned(1 << 20, 3), "*", Access::RemoteAccessible)
            .unwrap();
        let local = init
            .register(HostBuffer::new(1 << 20).unwrap(), "*", Access::LocalOnly)
            .unwrap();
        let seg = init.open_segment(target.segment_name()).unwrap();
        let base = seg.buffers().unwrap()[0].addr;
        let mut batch = init.batch(32).unwrap();
        // Warm up: connections, the engine's queues and scratch buffers.
        for _ in 0..20 {
            round(&mut batch, &local, &seg, base);
        }
        let ((), n) = counted(|| {
            for _ in 0..200 {
                round(&mut batch, &local, &seg, base);
            }
        });
        assert_eq!(
            n, 0,
            "same_host={same_host}: {n} allocations in 200 rounds of 32 requests"
        );
    }
}
