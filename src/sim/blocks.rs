//! A KV block allocator shared by a simulated engine's requests.
use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::Notify;

/// Free block ids; `allocate` waits until enough are free.
pub struct BlockPool {
    free: Mutex<VecDeque<u64>>,
    total: usize,
    freed: Notify,
}

impl BlockPool {
    /// A pool of blocks `0..n`.
    pub fn new(n: usize) -> Self {
        Self {
            free: Mutex::new((0..n as u64).collect()),
            total: n,
            freed: Notify::new(),
        }
    }

    /// Blocks in all.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Blocks free now.
    pub fn available(&self) -> usize {
        self.free.lock().unwrap().len()
    }

    /// Takes `n` blocks now, or None.
    pub fn try_allocate(&self, n: usize) -> Option<Vec<u64>> {
        let mut f = self.free.lock().unwrap();
        if f.len() < n {
            return None;
        }
        Some(f.drain(..n).collect())
    }

    /// Takes `n` blocks, waiting for frees; None if `n` exceeds the pool.
    pub async fn allocate(&self, n: usize) -> Option<Vec<u64>> {
        if n > self.total {
            return None;
        }
        loop {
            let notified = self.freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(b) = self.try_allocate(n) {
                return Some(b);
            }
            notified.await;
        }
    }

    /// Returns blocks.
    pub fn free(&self, blocks: &[u64]) {
        self.free.lock().unwrap().extend(blocks.iter().copied());
        self.freed.notify_waiters();
    }
}
