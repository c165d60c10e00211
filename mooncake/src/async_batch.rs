//! Batches for async code: completion is a future, woken by the engine's
//! reactor (no polling, no thread parked per wait), and the batch shares
//! ownership of the memory its requests use, so that nothing a transfer
//! touches can be freed while it runs, whatever happens to the future.
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use mooncake_sys as sys;

use crate::batch::{checked_request, outcome, Opcode, Statuses};
use crate::blocks::BlockRegion;
use crate::error::{Error, ErrorCode, Result};
use crate::ffi::RequestBuf;
use crate::memory::LocalMemory;
use crate::segment::RemoteSegment;
use crate::shared::EngineShared;

/// Memory an async batch keeps alive.
type Shared = Arc<dyn LocalMemory + Send + Sync>;

/// A batch for async code, made by
/// [`Engine::async_batch`](crate::Engine::async_batch).
///
/// Requests take the local memory as an [`Arc`] (a shared registration),
/// not a borrow: the batch holds a clone until every transfer that uses it
/// has ended. [`run`](Self::run) submits the queued requests and returns a
/// future of their completion; the future may be dropped at any point (a
/// timeout, a cancelled task): the transfers go on, and the batch, dropped
/// while they run, hands itself and the memory to the engine's reactor,
/// which lets go of both once they end. Nothing blocks, nothing is freed
/// early.
///
/// ```
/// use std::sync::Arc;
/// use mooncake::{Access, Engine, LocalMemory};
///
/// # fn main() -> mooncake::Result<()> {
/// let target = Engine::builder().local_host("127.0.0.1").build()?;
/// let initiator = Engine::builder().local_host("127.0.0.1").build()?;
/// let published = target.register(vec![7u8; 8192], "*", Access::RemoteAccessible)?;
/// let peer = initiator.open_segment(target.segment_name())?;
/// let local = Arc::new(initiator.register(vec![0u8; 8192], "*", Access::LocalOnly)?);
///
/// let mut batch = initiator.async_batch(2)?;
/// batch.read(&local, 0, &peer, published.addr(), 4096)?;
/// batch.read(&local, 4096, &peer, published.addr() + 4096, 4096)?;
/// // Any executor: here the futures crate's, as tokio's `.await` would.
/// futures::executor::block_on(batch.run())?;
/// batch.reset()?; // lets go of `local` (and makes room for more)
///
/// let local = Arc::try_unwrap(local).expect("the batch let go");
/// assert!(local.to_vec().iter().all(|b| *b == 7));
/// # Ok(())
/// # }
/// ```
pub struct AsyncBatch {
    engine: Arc<EngineShared>,
    id: u64,
    capacity: usize,
    queued: RequestBuf,
    submitted: usize,
    keep: Vec<Shared>,
    statuses: Vec<sys::transfer_status>,
    /// Submitted requests may still be running.
    in_flight: bool,
    /// `statuses[..submitted]` hold the terminal values read when the last
    /// run completed: status queries answer from here.
    fresh: bool,
}

impl std::fmt::Debug for AsyncBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncBatch")
            .field("capacity", &self.capacity)
            .field("queued", &self.queued.0.len())
            .field("submitted", &self.submitted)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

impl AsyncBatch {
    pub(crate) fn new(engine: Arc<EngineShared>, capacity: usize) -> Result<Self> {
        // Started now, so that a reactor that cannot start is an error here
        // rather than at the first await.
        engine.reactor()?;
        let id = engine.raw.allocate_batch(capacity)?;
        Ok(Self {
            engine,
            id,
            capacity,
            queued: RequestBuf(Vec::with_capacity(capacity)),
            submitted: 0,
            keep: Vec::new(),
            statuses: vec![sys::transfer_status::default(); capacity],
            in_flight: false,
            fresh: false,
        })
    }

    /// Requests this batch can hold in all.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Requests handed to the engine so far.
    pub fn submitted(&self) -> usize {
        self.submitted
    }

    /// Queues a READ of `len` bytes at `remote_addr` of `segment` into
    /// `local[local_offset..]`; the batch keeps a clone of `local`.
    pub fn read<L: LocalMemory + Send + Sync + 'static>(
        &mut self,
        local: &Arc<L>,
        local_offset: usize,
        segment: &RemoteSegment,
        remote_addr: u64,
        len: usize,
    ) -> Result<()> {
        self.push(Opcode::Read, local, local_offset, segment, remote_addr, len)
    }

    /// Queues a WRITE of `local[local_offset..local_offset + len]` to
    /// `remote_addr` of `segment`; the batch keeps a clone of `local`.
    pub fn write<L: LocalMemory + Send + Sync + 'static>(
        &mut self,
        local: &Arc<L>,
        local_offset: usize,
        segment: &RemoteSegment,
        remote_addr: u64,
        len: usize,
    ) -> Result<()> {
        self.push(
            Opcode::Write,
            local,
            local_offset,
            segment,
            remote_addr,
            len,
        )
    }

    fn push<L: LocalMemory + Send + Sync + 'static>(
        &mut self,
        op: Opcode,
        local: &Arc<L>,
        local_offset: usize,
        segment: &RemoteSegment,
        remote_addr: u64,
        len: usize,
    ) -> Result<()> {
        let request = checked_request(
            &self.engine,
            self.submitted + self.queued.0.len(),
            self.capacity,
            op,
            &**local,
            local_offset,
            segment,
            remote_addr,
            len,
        )?;
        // Compared by address first: a batch of many requests on one
        // registration clones its `Arc` once, not once per request.
        let ptr = Arc::as_ptr(local) as *const ();
        if !self
            .keep
            .iter()
            .any(|k| std::ptr::eq(Arc::as_ptr(k) as *const (), ptr))
        {
            self.keep.push(local.clone());
        }
        self.queued.0.push(request);
        Ok(())
    }

    /// Submits a block list as one task, as
    /// [`Batch::submit_blocks`](crate::Batch::submit_blocks) does (queued
    /// requests go first), and returns the task's index; the batch keeps a
    /// clone of `local`. The transfers start now: await [`run`](Self::run)
    /// for their outcome.
    pub fn submit_blocks<L: LocalMemory + Send + Sync + 'static>(
        &mut self,
        op: Opcode,
        local: &Arc<L>,
        segment: &RemoteSegment,
        regions: &[BlockRegion],
        local_ids: &[u64],
        remote_ids: &[u64],
    ) -> Result<usize> {
        if !Arc::ptr_eq(&segment.engine, &self.engine) {
            return Err(Error::InvalidArgument(format!(
                "segment {} was opened by another engine",
                segment.name()
            )));
        }
        let engine_regions = crate::blocks::engine_regions(
            &self.engine.raw,
            &**local,
            regions,
            local_ids,
            remote_ids,
        )?;
        if self.submitted + self.queued.0.len() >= self.capacity {
            return Err(Error::Engine {
                code: ErrorCode::TooManyRequests,
                message: format!("the batch is full ({} requests)", self.capacity),
            });
        }
        self.submit()?;
        if crate::memory::needs_prepare(&**local) {
            crate::memory::prepare(&**local)?;
        }
        let opcode = match op {
            Opcode::Read => sys::OPCODE_READ as i32,
            Opcode::Write => sys::OPCODE_WRITE as i32,
        };
        let task = self.engine.raw.submit_blocks(
            self.id,
            opcode,
            segment.id,
            &engine_regions,
            local_ids,
            remote_ids,
        )?;
        let ptr = Arc::as_ptr(local) as *const ();
        if !self
            .keep
            .iter()
            .any(|k| std::ptr::eq(Arc::as_ptr(k) as *const (), ptr))
        {
            self.keep.push(local.clone());
        }
        self.submitted += 1;
        self.in_flight = true;
        self.fresh = false;
        Ok(task)
    }

    /// Submits the queued requests and returns a future that resolves once
    /// every request submitted to this batch has ended: `Ok` when all
    /// completed, [`Error::Transfer`] naming the first failure otherwise.
    ///
    /// The transfers start now, not at the first poll. Dropping the future
    /// does not stop them (the engine bounds each by its progress
    /// timeout): after a timeout, `run` again (with nothing new queued) and
    /// await it to learn how they ended.
    pub fn run(&mut self) -> Completion<'_> {
        let early = self.submit().err();
        Completion { batch: self, early }
    }

    fn submit(&mut self) -> Result<()> {
        self.settle()?;
        if self.queued.0.is_empty() {
            return Ok(());
        }
        for m in &self.keep {
            if crate::memory::needs_prepare(&**m) {
                crate::memory::prepare(&**m)?;
            }
        }
        let n = self.queued.0.len();
        self.engine.raw.submit(self.id, &mut self.queued.0, None)?;
        self.queued.0.clear();
        self.submitted += n;
        self.in_flight = true;
        self.fresh = false;
        Ok(())
    }

    /// Whether the requests in flight have all ended (asking the engine,
    /// which then counts them as seen, once they have).
    fn settle(&mut self) -> Result<()> {
        if self.in_flight && self.engine.raw.wait_batch(self.id, Some(Duration::ZERO))? {
            self.in_flight = false;
        }
        Ok(())
    }

    /// Empties the batch for another round (same capacity) and lets go of
    /// the memory its requests used. Refused while requests are in flight:
    /// await [`run`](Self::run)'s future first.
    pub fn reset(&mut self) -> Result<()> {
        self.settle()?;
        if self.in_flight {
            return Err(Error::Engine {
                code: ErrorCode::BatchBusy,
                message: "requests are still in flight; await the batch's completion first".into(),
            });
        }
        if self.submitted > 0 {
            self.engine.raw.reset_batch(self.id)?;
        }
        self.submitted = 0;
        self.fresh = false;
        self.queued.0.clear();
        self.keep.clear();
        Ok(())
    }

    /// Every submitted request's status, read in one pass (none at all once
    /// a completed run has read them).
    pub fn statuses(&mut self) -> Result<Statuses<'_>> {
        if self.submitted > 0 && !self.fresh {
            self.engine
                .raw
                .batch_status(self.id, &mut self.statuses[..self.submitted])?;
        }
        Ok(Statuses::new(&self.statuses[..self.submitted]))
    }

    /// Why request `index` failed (empty if it did not).
    pub fn error_of(&self, index: usize) -> Result<String> {
        self.engine.raw.transfer_error(self.id, index)
    }

    fn outcome(&mut self) -> Result<()> {
        let total = self
            .engine
            .raw
            .batch_status(self.id, &mut self.statuses[..self.submitted])?
            .min(self.submitted);
        self.fresh = total == self.submitted;
        outcome(&self.engine.raw, self.id, &self.statuses[..total])
    }
}

impl Drop for AsyncBatch {
    fn drop(&mut self) {
        if self.settle().is_ok() && !self.in_flight {
            if let Err(e) = self.engine.raw.free_batch(self.id) {
                tracing::error!(target: "mooncake", error = %e, "freeing a batch failed");
            }
            return;
        }
        // Still running (or its state is unknown): the reactor keeps the
        // memory, and the engine with it, until the transfers end.
        let keep: (Vec<Shared>, Arc<EngineShared>) =
            (std::mem::take(&mut self.keep), self.engine.clone());
        match self.engine.reactor() {
            Ok(r) => r.adopt(self.id, Box::new(keep)),
            Err(e) => {
                // Without a reactor (it could not start) the one safe
                // course left is to wait here.
                tracing::warn!(target: "mooncake", error = %e, "no async reactor: waiting for a dropped batch");
                let _ = self.engine.raw.wait_batch(self.id, None);
                let _ = self.engine.raw.free_batch(self.id);
            }
        }
    }
}

/// The completion of an [`AsyncBatch::run`]: resolves when every request
/// submitted to the batch has ended. `Send`; dropping it early is safe (see
/// [`AsyncBatch`]).
#[must_use = "the transfers run anyway; await this to learn how they ended"]
pub struct Completion<'b> {
    batch: &'b mut AsyncBatch,
    early: Option<Error>,
}

impl std::fmt::Debug for Completion<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("batch", &self.batch)
            .finish()
    }
}

impl Future for Completion<'_> {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        if let Some(e) = this.early.take() {
            return Poll::Ready(Err(e));
        }
        let batch = &mut *this.batch;
        if !batch.in_flight {
            return Poll::Ready(if batch.submitted == 0 {
                Ok(())
            } else {
                batch.outcome()
            });
        }
        let engine = batch.engine.clone();
        let reactor = match engine.reactor().and_then(|r| r.check_alive().map(|()| r)) {
            Ok(r) => r,
            Err(e) => return Poll::Ready(Err(e)),
        };
        // Watch first, then look: a batch that ends in between is seen by
        // the look, one that ends after it wakes the watch.
        reactor.watch_batch(batch.id, cx.waker());
        match batch.settle() {
            Ok(()) if batch.in_flight => Poll::Pending,
            Ok(()) => {
                reactor.unwatch_batch(batch.id);
                Poll::Ready(batch.outcome())
            }
            Err(e) => {
                reactor.unwatch_batch(batch.id);
                Poll::Ready(Err(e))
            }
        }
    }
}

impl Drop for Completion<'_> {
    fn drop(&mut self) {
        if let Ok(r) = self.batch.engine.reactor() {
            r.unwatch_batch(self.batch.id);
        }
    }
}
