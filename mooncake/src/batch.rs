//! Batches of transfers.
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use mooncake_sys as sys;

use crate::blocks::BlockRegion;
use crate::error::{Error, Result};
use crate::ffi::{OwnedCString, RequestBuf};
use crate::memory::LocalMemory;
use crate::segment::RemoteSegment;
use crate::shared::EngineShared;

/// The status of one request, decoded from the engine's integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskStatus {
    /// In flight.
    Waiting,
    /// Pending (not produced by the TCP transport).
    Pending,
    /// Invalid.
    Invalid,
    /// Canceled.
    Canceled,
    /// Done: every byte moved.
    Completed,
    /// Timed out.
    Timeout,
    /// Failed; see the batch's error for why.
    Failed,
    /// A value this crate does not know.
    Unknown(i32),
}

impl TaskStatus {
    /// Decodes the engine's `STATUS_*` value.
    pub fn from_raw(v: i32) -> Self {
        match v {
            0 => Self::Waiting,
            1 => Self::Pending,
            2 => Self::Invalid,
            3 => Self::Canceled,
            4 => Self::Completed,
            5 => Self::Timeout,
            6 => Self::Failed,
            other => Self::Unknown(other),
        }
    }

    /// Whether the request has finished, one way or another.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Timeout | Self::Canceled
        )
    }
}

/// Direction of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    /// Remote → local.
    Read,
    /// Local → remote.
    Write,
}

/// A batch of transfers.
///
/// Queue requests with [`read`](Self::read) and [`write`](Self::write),
/// hand them to the engine with [`submit`](Self::submit) (one call, no copy:
/// the queued requests already have the C layout), and wait with
/// [`wait`](Self::wait). A batch borrows (`'r`) the local memory its
/// requests use, so that memory outlives it.
///
/// The batch id never leaves this type, so it cannot be forged or used after
/// the batch is freed. Dropping a batch with transfers in flight waits for
/// them (every transfer ends within the engine's timeouts), then frees it. A
/// wait that times out returns [`Error::Timeout`] and leaves the batch with
/// you, still in flight.
///
/// ```
/// use mooncake::{Access, Engine, HostBuffer, TaskStatus};
///
/// # fn main() -> mooncake::Result<()> {
/// let target = Engine::builder().local_host("127.0.0.1").build()?;
/// let initiator = Engine::builder().local_host("127.0.0.1").build()?;
/// let mut buf = HostBuffer::new(8192)?;
/// buf[..4096].fill(1);
/// let published = target.register(buf, "*", Access::RemoteAccessible)?;
/// let local = initiator.register(vec![2u8; 8192], "*", Access::LocalOnly)?;
///
/// let peer = initiator.open_segment(target.segment_name())?;
/// let remote = peer.buffers()?[0];
/// let mut batch = initiator.batch(2)?;
/// batch.read(&local, 0, &peer, remote.addr, 4096)?; // remote[..4096] -> local
/// batch.write(&local, 4096, &peer, remote.addr + 4096, 4096)?; // local -> remote[4096..]
/// batch.submit()?;
/// batch.wait(None)?;
/// assert_eq!(batch.status(0)?, TaskStatus::Completed);
/// assert_eq!(batch.transferred_bytes(1)?, 4096);
/// drop(batch); // ends the borrow of `local`
///
/// assert_eq!(local.to_vec()[..4096], [1; 4096]);
/// assert_eq!(published.to_vec()[4096..], [2; 4096]);
/// # Ok(())
/// # }
/// ```
pub struct Batch<'r> {
    engine: Arc<EngineShared>,
    id: u64,
    capacity: usize,
    queued: RequestBuf,
    submitted: usize,
    // Every submitted request has been seen terminal by a wait.
    settled: bool,
    // `statuses[..submitted]` hold terminal values read after a completed
    // wait: they can no longer change, so status queries answer from here.
    fresh: bool,
    statuses: Vec<sys::transfer_status>,
    // Local memory whose queued GPU work must finish before the submit.
    prepare: Vec<&'r dyn LocalMemory>,
    _borrows: PhantomData<&'r ()>,
}

impl std::fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("capacity", &self.capacity)
            .field("queued", &self.queued.0.len())
            .field("submitted", &self.submitted)
            .finish()
    }
}

impl<'r> Batch<'r> {
    pub(crate) fn new(engine: Arc<EngineShared>, capacity: usize) -> Result<Self> {
        let id = engine.raw.allocate_batch(capacity)?;
        Ok(Self {
            engine,
            id,
            capacity,
            // Both buffers are sized once here: queuing, submitting and
            // waiting allocate nothing.
            queued: RequestBuf(Vec::with_capacity(capacity)),
            submitted: 0,
            settled: false,
            fresh: false,
            statuses: vec![sys::transfer_status::default(); capacity],
            prepare: Vec::new(),
            _borrows: PhantomData,
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

    /// Requests queued but not yet submitted.
    pub fn queued(&self) -> usize {
        self.queued.0.len()
    }

    /// Queues a READ of `len` bytes at `remote_addr` of `segment` into
    /// `local[local_offset..]`.
    pub fn read<L: LocalMemory>(
        &mut self,
        local: &'r L,
        local_offset: usize,
        segment: &RemoteSegment,
        remote_addr: u64,
        len: usize,
    ) -> Result<()> {
        self.push(Opcode::Read, local, local_offset, segment, remote_addr, len)
    }

    /// Queues a WRITE of `local[local_offset..local_offset + len]` to
    /// `remote_addr` of `segment`.
    pub fn write<L: LocalMemory>(
        &mut self,
        local: &'r L,
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

    fn push<L: LocalMemory>(
        &mut self,
        op: Opcode,
        local: &'r L,
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
            local,
            local_offset,
            segment,
            remote_addr,
            len,
        )?;
        if crate::memory::needs_prepare(local)
            && !self
                .prepare
                .iter()
                .any(|p| std::ptr::addr_eq(*p as *const dyn LocalMemory, local as *const L))
        {
            self.prepare.push(local);
        }
        self.queued.0.push(request);
        Ok(())
    }

    /// Hands every queued request to the engine.
    pub fn submit(&mut self) -> Result<()> {
        self.submit_inner(None)
    }

    /// Like [`submit`](Self::submit), and once every request of the batch
    /// has completed, the engine sends `(name, message)` to the segment of
    /// the first queued request (upstream's `submitTransferWithNotify`).
    ///
    /// ```
    /// # use mooncake::{Access, Engine};
    /// # fn main() -> mooncake::Result<()> {
    /// # let target = Engine::builder().build()?;
    /// # let initiator = Engine::builder().build()?;
    /// # let _published = target.register(vec![0u8; 4096], "*", Access::RemoteAccessible)?;
    /// # let peer = initiator.open_segment(target.segment_name())?;
    /// # let remote = peer.buffers()?[0];
    /// let local = initiator.register(vec![1u8; 4096], "*", Access::LocalOnly)?;
    /// let mut batch = initiator.batch(1)?;
    /// batch.write(&local, 0, &peer, remote.addr, 4096)?;
    /// batch.submit_with_notify("req-7", "kv ready")?;
    /// batch.wait(None)?;
    /// // The target learns that the data has landed:
    /// let got = target.notifications()?;
    /// assert_eq!(got[0].message, "kv ready");
    /// # Ok(())
    /// # }
    /// ```
    pub fn submit_with_notify(&mut self, name: &str, message: &str) -> Result<()> {
        let n = OwnedCString::new("notification name", name)?;
        let m = OwnedCString::new("notification message", message)?;
        self.submit_inner(Some((&n, &m)))
    }

    fn submit_inner(&mut self, notify: Option<(&OwnedCString, &OwnedCString)>) -> Result<()> {
        if self.queued.0.is_empty() {
            return if notify.is_some() {
                Err(Error::InvalidArgument(
                    "a notify needs at least one queued request".into(),
                ))
            } else {
                Ok(())
            };
        }
        for m in &self.prepare {
            crate::memory::prepare(*m)?;
        }
        self.prepare.clear();
        let n = self.queued.0.len();
        // On failure nothing was submitted: the engine validates every
        // request before it accepts any.
        self.engine
            .raw
            .submit(self.id, &mut self.queued.0, notify)?;
        self.submitted += n;
        self.settled = false;
        self.fresh = false;
        self.queued.0.clear();
        Ok(())
    }

    /// Submits a block list as one task of this batch and returns the
    /// task's index: for every region and every `i`, local block
    /// `local_ids[i]` and remote block `remote_ids[i]` of that region
    /// ([`Opcode::Read`]: remote → local, [`Opcode::Write`]: local → remote).
    /// Requests queued before are submitted first, so task indices follow
    /// call order.
    ///
    /// A KV transfer names the same blocks in every layer: one list costs the
    /// engine per region and per id, where one request per block costs per
    /// region × id. Where the peer's GPU memory is mapped into this process
    /// (CUDA IPC), the whole list is one kernel launch.
    ///
    /// The task completes when every piece has; it fails with the first
    /// failed piece's reason, and its transferred bytes count every piece.
    /// Refused with the cause: id lists of different lengths or empty,
    /// destination ids repeated, a destination stride shorter than
    /// `block_len`, a region's local blocks outside `local`, more than
    /// 65,536 regions or 2^24 pieces. The checks made here (lengths,
    /// local blocks, room) come before queued requests are submitted; a
    /// list the engine refuses adds no task, but the queued requests have
    /// gone. Pieces run in any order.
    ///
    /// ```
    /// use mooncake::{Access, BlockRegion, Engine, Opcode, TaskStatus};
    ///
    /// # fn main() -> mooncake::Result<()> {
    /// let target = Engine::builder().local_host("127.0.0.1").build()?;
    /// let initiator = Engine::builder().local_host("127.0.0.1").build()?;
    /// // Two "layers" of 8 blocks of 1 KiB on each side.
    /// let remote_kv: Vec<u8> = (0..16 * 1024).map(|i| (i / 1024) as u8).collect();
    /// let _published = target.register(remote_kv, "*", Access::RemoteAccessible)?;
    /// let local = initiator.register(vec![0u8; 16 * 1024], "*", Access::LocalOnly)?;
    /// let peer = initiator.open_segment(target.segment_name())?;
    /// let remote = peer.buffers()?[0].addr;
    /// let layers = [
    ///     BlockRegion::packed(0, remote, 1024),
    ///     BlockRegion::packed(8 * 1024, remote + 8 * 1024, 1024),
    /// ];
    /// let mut batch = initiator.batch(1)?;
    /// // Remote blocks 5 and 2 of both layers into local blocks 0 and 1.
    /// let task = batch.submit_blocks(Opcode::Read, &local, &peer, &layers, &[0, 1], &[5, 2])?;
    /// batch.wait(None)?;
    /// assert_eq!(batch.status(task)?, TaskStatus::Completed);
    /// assert_eq!(batch.transferred_bytes(task)?, 4 * 1024);
    /// drop(batch);
    /// let got = local.to_vec();
    /// assert_eq!((got[0], got[1024], got[8 * 1024], got[9 * 1024]), (5, 2, 13, 10));
    /// # Ok(())
    /// # }
    /// ```
    pub fn submit_blocks<L: LocalMemory>(
        &mut self,
        op: Opcode,
        local: &'r L,
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
        let engine_regions =
            crate::blocks::engine_regions(&self.engine.raw, local, regions, local_ids, remote_ids)?;
        if self.submitted + self.queued.0.len() >= self.capacity {
            return Err(Error::Engine {
                code: crate::ErrorCode::TooManyRequests,
                message: format!("the batch is full ({} requests)", self.capacity),
            });
        }
        self.submit_inner(None)?;
        if crate::memory::needs_prepare(local) {
            crate::memory::prepare(local)?;
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
        self.submitted += 1;
        self.settled = false;
        self.fresh = false;
        Ok(task)
    }

    /// Empties the batch for another round of requests: same capacity, no
    /// allocation (in Rust or in the engine), so a loop of
    /// queue → [`submit`](Self::submit) → [`wait`](Self::wait) → `reset`
    /// allocates nothing per transfer. Requests still in flight are waited
    /// for first (as on drop); queued ones are dropped.
    ///
    /// ```
    /// # use mooncake::{Access, Engine};
    /// # fn main() -> mooncake::Result<()> {
    /// # let target = Engine::builder().build()?;
    /// # let initiator = Engine::builder().build()?;
    /// # let _published = target.register(vec![5u8; 1 << 16], "*", Access::RemoteAccessible)?;
    /// # let peer = initiator.open_segment(target.segment_name())?;
    /// # let remote = peer.buffers()?[0];
    /// let local = initiator.register(vec![0u8; 1 << 16], "*", Access::LocalOnly)?;
    /// let mut batch = initiator.batch(1)?;
    /// for block in 0..4u64 {
    ///     let offset = (block as usize) << 14;
    ///     batch.read(&local, offset, &peer, remote.addr + (block << 14), 1 << 14)?;
    ///     batch.submit()?;
    ///     batch.wait(None)?;
    ///     batch.reset()?; // room for the next request, same capacity
    /// }
    /// drop(batch);
    /// assert!(local.to_vec().iter().all(|b| *b == 5));
    /// # Ok(())
    /// # }
    /// ```
    pub fn reset(&mut self) -> Result<()> {
        if self.submitted > 0 {
            if !self.settled {
                self.engine.raw.wait_batch(self.id, None)?;
            }
            self.engine.raw.reset_batch(self.id)?;
        }
        self.submitted = 0;
        self.settled = false;
        self.fresh = false;
        self.queued.0.clear();
        self.prepare.clear();
        Ok(())
    }

    /// Waits for every submitted request. `timeout` None waits until the
    /// engine finishes them (bounded by its progress timeouts).
    ///
    /// Returns [`Error::Transfer`] when some failed (with the first reason),
    /// [`Error::Timeout`] when the time ran out: the batch is then still in
    /// flight and still yours.
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<()> {
        if self.submitted == 0 {
            return Ok(());
        }
        if !self.engine.raw.wait_batch(self.id, timeout)? {
            return Err(Error::Timeout(timeout.unwrap_or_default()));
        }
        // A completed wait marks every task observed (so reset may reuse it).
        self.settled = true;
        // One pass over the statuses: they are all terminal now, so later
        // status queries answer from this copy without asking the engine.
        let total = self
            .engine
            .raw
            .batch_status(self.id, &mut self.statuses[..self.submitted])?;
        let total = total.min(self.submitted);
        self.fresh = true;
        outcome(&self.engine.raw, self.id, &self.statuses[..total])
    }

    /// Status of request `index` (in submission order) as of now.
    ///
    /// Costs O(1) whatever the batch size: one engine call, or none once a
    /// [`wait`](Self::wait) has seen every request finish. To look at every
    /// request, [`statuses`](Self::statuses) reads them all in one pass.
    pub fn status(&mut self, index: usize) -> Result<TaskStatus> {
        self.refresh_one(index)?;
        Ok(TaskStatus::from_raw(self.statuses[index].status))
    }

    /// Bytes moved by request `index` (0 unless it completed). O(1), as
    /// [`status`](Self::status).
    pub fn transferred_bytes(&mut self, index: usize) -> Result<u64> {
        self.refresh_one(index)?;
        Ok(self.statuses[index].transferred_bytes)
    }

    /// Every submitted request's status, read in one pass (none at all when
    /// a [`wait`](Self::wait) has already seen them all finish).
    ///
    /// ```
    /// # use mooncake::{Access, Engine, Error, TaskStatus};
    /// # fn main() -> mooncake::Result<()> {
    /// # let target = Engine::builder().build()?;
    /// # let initiator = Engine::builder().build()?;
    /// # let _published = target.register(vec![0u8; 8192], "*", Access::RemoteAccessible)?;
    /// # let peer = initiator.open_segment(target.segment_name())?;
    /// # let remote = peer.buffers()?[0];
    /// let local = initiator.register(vec![0u8; 8192], "*", Access::LocalOnly)?;
    /// let mut batch = initiator.batch(2)?;
    /// batch.read(&local, 0, &peer, remote.addr, 4096)?;
    /// // Past the end of the peer's buffer: this request fails.
    /// batch.read(&local, 4096, &peer, remote.addr + 8192, 4096)?;
    /// batch.submit()?;
    /// let err = batch.wait(None).unwrap_err();
    /// assert!(matches!(err, Error::Transfer { failed: 1, first_task: 1, .. }));
    ///
    /// let statuses = batch.statuses()?;
    /// assert_eq!(statuses.get(0), Some(TaskStatus::Completed));
    /// assert_eq!(statuses.not_completed().collect::<Vec<_>>(), [1]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn statuses(&mut self) -> Result<Statuses<'_>> {
        if !self.fresh && self.submitted > 0 {
            self.engine
                .raw
                .batch_status(self.id, &mut self.statuses[..self.submitted])?;
            self.fresh = self.statuses[..self.submitted]
                .iter()
                .all(|st| TaskStatus::from_raw(st.status).is_terminal());
        }
        Ok(Statuses {
            raw: &self.statuses[..self.submitted],
        })
    }

    fn refresh_one(&mut self, index: usize) -> Result<()> {
        if index >= self.submitted {
            return Err(Error::InvalidArgument(format!(
                "request {index} does not exist ({} submitted)",
                self.submitted
            )));
        }
        if !self.fresh {
            self.statuses[index] = self.engine.raw.task_status(self.id, index)?;
        }
        Ok(())
    }

    /// Why request `index` failed (empty if it did not).
    pub fn error_of(&self, index: usize) -> Result<String> {
        self.engine.raw.transfer_error(self.id, index)
    }
}

/// The engine request for `op` on `local[local_offset..][..len]` and
/// `remote_addr` of `segment`, after the checks every batch makes on what
/// its caller passes: the segment belongs to `engine`, the local range is
/// registered with it and inside the memory, the remote range does not wrap,
/// and the batch (`used` of `capacity` requests) has room.
#[allow(clippy::too_many_arguments)]
pub(crate) fn checked_request<L: LocalMemory + ?Sized>(
    engine: &Arc<EngineShared>,
    used: usize,
    capacity: usize,
    op: Opcode,
    local: &L,
    local_offset: usize,
    segment: &RemoteSegment,
    remote_addr: u64,
    len: usize,
) -> Result<sys::transfer_request> {
    if !Arc::ptr_eq(&segment.engine, engine) {
        return Err(Error::InvalidArgument(format!(
            "segment {} was opened by another engine",
            segment.name()
        )));
    }
    let source = crate::memory::local_range(local, &engine.raw, local_offset, len)?;
    if remote_addr.checked_add(len as u64).is_none() {
        return Err(Error::InvalidArgument(format!(
            "remote range of {len} bytes at {remote_addr:#x} wraps around"
        )));
    }
    if used >= capacity {
        return Err(Error::Engine {
            code: crate::ErrorCode::TooManyRequests,
            message: format!("the batch is full ({capacity} requests)"),
        });
    }
    Ok(sys::transfer_request {
        opcode: match op {
            Opcode::Read => sys::OPCODE_READ as i32,
            Opcode::Write => sys::OPCODE_WRITE as i32,
        },
        source: source.cast(),
        target_id: segment.id,
        target_offset: remote_addr,
        length: len as u64,
    })
}

/// `Ok` when every request of `statuses` (all terminal) completed, else
/// [`Error::Transfer`] with the count and the first failure's reason.
pub(crate) fn outcome(
    raw: &crate::ffi::RawEngine,
    id: u64,
    statuses: &[sys::transfer_status],
) -> Result<()> {
    let mut failed = 0usize;
    let mut first = None;
    for (i, st) in statuses.iter().enumerate() {
        if TaskStatus::from_raw(st.status) != TaskStatus::Completed {
            failed += 1;
            first.get_or_insert(i);
        }
    }
    match first {
        None => Ok(()),
        Some(task) => {
            let message = raw
                .transfer_error(id, task)
                .unwrap_or_else(|e| format!("(reason unavailable: {e})"));
            Err(Error::Transfer {
                failed,
                total: statuses.len(),
                first_task: task,
                message,
            })
        }
    }
}

/// The statuses of a batch's submitted requests, in submission order, as
/// read by [`Batch::statuses`].
#[derive(Debug, Clone, Copy)]
pub struct Statuses<'b> {
    raw: &'b [sys::transfer_status],
}

impl<'b> Statuses<'b> {
    pub(crate) fn new(raw: &'b [sys::transfer_status]) -> Self {
        Self { raw }
    }

    /// Requests covered.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Whether no request was submitted.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// Status of request `index`, None past the end.
    pub fn get(&self, index: usize) -> Option<TaskStatus> {
        self.raw
            .get(index)
            .map(|st| TaskStatus::from_raw(st.status))
    }

    /// Bytes moved by request `index` (0 unless it completed), None past
    /// the end.
    pub fn transferred_bytes(&self, index: usize) -> Option<u64> {
        self.raw.get(index).map(|st| st.transferred_bytes)
    }

    /// Every status, in submission order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = TaskStatus> + 'b {
        self.raw.iter().map(|st| TaskStatus::from_raw(st.status))
    }

    /// Indices of the requests that did not complete (failed, timed out,
    /// canceled, or still in flight).
    pub fn not_completed(&self) -> impl Iterator<Item = usize> + 'b {
        self.raw
            .iter()
            .enumerate()
            .filter(|(_, st)| TaskStatus::from_raw(st.status) != TaskStatus::Completed)
            .map(|(i, _)| i)
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        if self.submitted > 0 {
            // Transfers may still read or write the borrowed memory: wait
            // for them before the borrows end.
            if let Err(e) = self.engine.raw.wait_batch(self.id, None) {
                tracing::error!(target: "mooncake", error = %e, "waiting for a dropped batch failed");
            }
            if !self.fresh {
                let _ = self
                    .engine
                    .raw
                    .batch_status(self.id, &mut self.statuses[..self.submitted]);
            }
        }
        if let Err(e) = self.engine.raw.free_batch(self.id) {
            tracing::error!(target: "mooncake", error = %e, "freeing a batch failed");
        }
    }
}
