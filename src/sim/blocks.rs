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

/// One [`BlockPool`] per KV-cache group: a request takes block ids from
/// each (hybrid models have groups with their own block ids).
pub struct GroupPools {
    pools: Vec<BlockPool>,
}

impl GroupPools {
    /// `groups` pools of blocks `0..n` each.
    pub fn new(groups: usize, n: usize) -> Self {
        Self {
            pools: (0..groups.max(1)).map(|_| BlockPool::new(n)).collect(),
        }
    }

    /// Blocks in all, every group.
    pub fn total(&self) -> usize {
        self.pools.iter().map(BlockPool::total).sum()
    }

    /// Blocks free now, every group.
    pub fn available(&self) -> usize {
        self.pools.iter().map(BlockPool::available).sum()
    }

    /// Whether `counts` (per group) fit the pools at all.
    pub fn fits(&self, counts: &[usize]) -> bool {
        counts.len() == self.pools.len()
            && counts.iter().zip(&self.pools).all(|(&n, p)| n <= p.total())
    }

    /// Takes `counts[g]` blocks from group `g`'s pool, waiting for frees
    /// (groups in order, so two requests never wait on each other); None if
    /// they do not fit.
    pub async fn allocate(&self, counts: &[usize]) -> Option<Vec<Vec<u64>>> {
        if !self.fits(counts) {
            return None;
        }
        // Blocks taken so far go back if this future is dropped while it
        // waits for a later group (a client that left, say).
        let mut taken = Taken {
            pools: self,
            blocks: Vec::with_capacity(counts.len()),
        };
        for (&n, pool) in counts.iter().zip(&self.pools) {
            let ids = pool.allocate(n).await?;
            taken.blocks.push(ids);
        }
        Some(std::mem::take(&mut taken.blocks))
    }

    /// Returns blocks (ids per group).
    pub fn free(&self, blocks: &[Vec<u64>]) {
        for (ids, pool) in blocks.iter().zip(&self.pools) {
            pool.free(ids);
        }
    }
}

/// Blocks of a [`GroupPools::allocate`] in progress, freed on drop unless
/// handed out.
struct Taken<'a> {
    pools: &'a GroupPools,
    blocks: Vec<Vec<u64>>,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.pools.free(&self.blocks);
    }
}

/// How many block ids `blocks` holds, every group.
pub fn count(blocks: &[Vec<u64>]) -> usize {
    blocks.iter().map(Vec::len).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_allocation_dropped_while_waiting_frees_what_it_took() {
        let pools = GroupPools::new(2, 4);
        // Group 1 is full: an allocation takes group 0's blocks, then waits.
        let held = pools.allocate(&[0, 4]).await.unwrap();
        assert_eq!(pools.available(), 4);
        let waiting = pools.allocate(&[3, 1]);
        let gone = tokio::time::timeout(std::time::Duration::from_millis(50), waiting).await;
        assert!(gone.is_err(), "it waits for group 1");
        // Dropped by the timeout: group 0's three blocks are back.
        assert_eq!(pools.available(), 4);
        pools.free(&held);
        assert_eq!(pools.available(), 8);
        assert!(pools.allocate(&[4, 4]).await.is_some());
    }
}
