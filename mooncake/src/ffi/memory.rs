//! Registered regions: memory an engine serves, unregistered on drop.
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};

use super::engine::{OwnedCString, RawEngine};

/// Memory registered with an engine, unregistered on drop.
///
/// Only built from memory that the caller guarantees stays valid and
/// unmoved until this value is dropped (see `register`).
#[doc(hidden)]
pub struct RegisteredRegion {
    engine: Arc<RawEngine>,
    ptr: *mut u8,
    len: usize,
    remote_accessible: bool,
    device: Option<u32>,
    registered: bool,
    // Engine-allocated: unregistering frees it (mc_managed_buffer_free).
    managed: bool,
}

// SAFETY: the region is a description of memory plus an engine handle
// (itself Send + Sync); access to the bytes goes through the copy methods
// below, which never create references, so sharing or sending the
// description across threads cannot create aliasing references.
unsafe impl Send for RegisteredRegion {}
// SAFETY: see `Send`.
unsafe impl Sync for RegisteredRegion {}

impl RegisteredRegion {
    /// Registers `len` bytes at `ptr` with the engine.
    ///
    /// # Safety
    /// The memory must be valid for reads and writes of `len` bytes, must not
    /// move, and must not be freed or otherwise accessed through references
    /// until the returned region has been dropped.
    pub(crate) unsafe fn register(
        engine: Arc<RawEngine>,
        ptr: *mut u8,
        len: usize,
        location: &str,
        remote_accessible: bool,
    ) -> Result<Self> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "cannot register an empty buffer".into(),
            ));
        }
        let loc = OwnedCString::new("location", location)?;
        // SAFETY: forwarded from this function's contract.
        unsafe { engine.register(ptr, len, &loc, remote_accessible)? };
        // SAFETY: registered just above, with these arguments, by this call.
        Ok(unsafe { Self::adopt(engine, ptr, len, remote_accessible) })
    }

    /// A region the engine registered already (batch registration).
    ///
    /// # Safety
    /// As for `register`, and `ptr`/`len` must be registered with `engine`
    /// (`remote_accessible` as given) and by nobody else.
    pub(crate) unsafe fn adopt(
        engine: Arc<RawEngine>,
        ptr: *mut u8,
        len: usize,
        remote_accessible: bool,
    ) -> Self {
        // The engine classified the pointer the same way; device memory is
        // then only ever touched through GPU copies.
        let device = super::gpu::pointer_device(ptr);
        Self {
            engine,
            ptr,
            len,
            remote_accessible,
            device,
            registered: true,
            managed: false,
        }
    }

    /// A managed buffer the engine allocated and registered; unregistering
    /// frees it.
    ///
    /// # Safety
    /// `ptr`/`len` must be a managed buffer of `engine` that nobody else frees.
    pub(crate) unsafe fn adopt_managed(engine: Arc<RawEngine>, ptr: *mut u8, len: usize) -> Self {
        Self {
            engine,
            ptr,
            len,
            remote_accessible: true,
            device: None,
            registered: true,
            managed: true,
        }
    }

    pub(crate) fn device(&self) -> Option<u32> {
        self.device
    }

    pub(crate) fn engine(&self) -> &Arc<RawEngine> {
        &self.engine
    }

    pub(crate) fn location(&self) -> Result<String> {
        self.engine.memory_location(self.ptr)
    }

    pub(crate) fn addr(&self) -> u64 {
        self.ptr as u64
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn remote_accessible(&self) -> bool {
        self.remote_accessible
    }

    fn check_range(&self, offset: usize, n: usize) -> Result<()> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "range of {n} bytes at offset {offset} exceeds the registered {} bytes",
                self.len
            ))),
        }
    }

    /// Copies bytes out of the region with relaxed atomic loads, so it never
    /// races (in Rust's sense) with [`write_shared`](Self::write_shared) on
    /// another thread. Bytes that a transfer writes at the same moment are
    /// unspecified, never undefined: no reference to the region is created.
    pub(crate) fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        if self.device.is_some() {
            // SAFETY: device memory valid for the range until drop; `out` is
            // a distinct host buffer.
            return unsafe { super::gpu::copy(out.as_mut_ptr(), self.ptr.add(offset), out.len()) };
        }
        // SAFETY: the range lies inside memory that stays valid until this
        // region is dropped; it is only ever accessed through atomics or
        // while exclusively borrowed (`&mut self` methods).
        unsafe { atomic_copy_out(self.ptr.add(offset), out) };
        Ok(())
    }

    /// Copies bytes into the region through `&self`, with relaxed atomic
    /// stores: several threads may write (disjoint or not) at once without
    /// undefined behaviour, while transfers use other parts of the region.
    pub(crate) fn write_shared(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        if self.device.is_some() {
            // SAFETY: as in `read_at`, copying the other way.
            return unsafe { super::gpu::copy(self.ptr.add(offset), data.as_ptr(), data.len()) };
        }
        // SAFETY: as in `read_at`.
        unsafe { atomic_copy_in(self.ptr.add(offset), data) };
        Ok(())
    }

    /// Copies bytes into the region. `&mut self` keeps Rust readers and
    /// writers away (batches borrow the registration, so in-flight ones
    /// forbid `&mut`), so a plain copy is fine.
    pub(crate) fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        if self.device.is_some() {
            return self.write_shared(offset, data);
        }
        // SAFETY: the range is inside the registered memory; `&mut self`
        // excludes every other Rust access; `data` is a distinct buffer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset), data.len()) };
        Ok(())
    }

    pub(crate) fn fill(&mut self, byte: u8) -> Result<()> {
        if let Some(dev) = self.device {
            // SAFETY: the whole region is valid device memory of `dev`.
            return unsafe { super::gpu::memset(dev, self.ptr, byte, self.len) };
        }
        // `&mut self`: no other Rust access; a plain memset is fine.
        // SAFETY: the whole region is valid for writes (see `register`).
        unsafe { std::ptr::write_bytes(self.ptr, byte, self.len) };
        Ok(())
    }

    /// Exclusive access to a local-only region's bytes, after every transfer
    /// that touches it has finished.
    pub(crate) fn local_slice_mut(&mut self, timeout: Option<Duration>) -> Result<&mut [u8]> {
        if self.device.is_some() {
            return Err(Error::InvalidArgument(
                "GPU memory cannot be borrowed as a host slice; use read_at/write_at".into(),
            ));
        }
        if self.remote_accessible {
            return Err(Error::InvalidArgument(
                "remote-accessible memory may be written by peers at any time; use read_at/write_at \
                 or take the memory back with into_inner()"
                    .into(),
            ));
        }
        // Batches borrow the registration, so `&mut self` means none is alive;
        // a leaked batch may still be running, which the engine's pin count
        // tells us. Local-only memory is pinned by our own transfers only.
        self.engine.wait_region_idle(self.ptr, timeout)?;
        // SAFETY: the memory is valid for `len` bytes; `&mut self` excludes
        // other Rust access; local-only memory is never written by peers and
        // no transfer of ours touches it now (checked above) or can start
        // while this borrow lives (submits need `&self`).
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }

    /// Unregisters now. After success the memory is no longer touched by the
    /// engine or by peers.
    pub(crate) fn unregister(&mut self) -> Result<()> {
        if !self.registered {
            return Ok(());
        }
        if self.managed {
            self.engine.free_managed(self.ptr, self.len)?;
        } else {
            self.engine.unregister(self.ptr)?;
        }
        self.registered = false;
        Ok(())
    }

    /// Gives up on unregistering: the owner promises to leak the memory, so
    /// whatever the engine or a peer still does with it stays harmless.
    pub(crate) fn abandon(&mut self) {
        self.registered = false;
    }
}

impl Drop for RegisteredRegion {
    fn drop(&mut self) {
        if let Err(e) = self.unregister() {
            // The memory's owner is about to reclaim it while the engine may
            // still use it: continuing could corrupt memory. This cannot
            // happen unless the engine's own bookkeeping is broken.
            tracing::error!(target: "mooncake", error = %e, addr = self.addr(), "unregistering memory failed");
            eprintln!("mooncake: unregistering memory at {:#x} failed ({e}); aborting to avoid memory corruption", self.addr());
            std::process::abort();
        }
    }
}

/// Copies `out.len()` bytes from `src` with relaxed atomic loads (8 bytes at
/// a time where aligned).
///
/// # Safety
/// `src` must be valid for reads of `out.len()` bytes, and every concurrent
/// Rust access to those bytes must be atomic too.
unsafe fn atomic_copy_out(src: *const u8, out: &mut [u8]) {
    let n = out.len();
    let mut i = 0usize;
    while i < n && !(src as usize + i).is_multiple_of(8) {
        // SAFETY: in bounds per the contract; AtomicU8 has no alignment needs.
        out[i] = unsafe { AtomicU8::from_ptr(src.add(i).cast_mut()) }.load(Ordering::Relaxed);
        i += 1;
    }
    while i + 8 <= n {
        // SAFETY: in bounds and 8-byte aligned (loop above).
        let v = unsafe { AtomicU64::from_ptr(src.add(i).cast::<u64>().cast_mut()) }
            .load(Ordering::Relaxed);
        out[i..i + 8].copy_from_slice(&v.to_ne_bytes());
        i += 8;
    }
    while i < n {
        // SAFETY: in bounds per the contract.
        out[i] = unsafe { AtomicU8::from_ptr(src.add(i).cast_mut()) }.load(Ordering::Relaxed);
        i += 1;
    }
}

/// Copies `data` to `dst` with relaxed atomic stores.
///
/// # Safety
/// `dst` must be valid for writes of `data.len()` bytes, and every concurrent
/// Rust access to those bytes must be atomic too.
unsafe fn atomic_copy_in(dst: *mut u8, data: &[u8]) {
    let n = data.len();
    let mut i = 0usize;
    while i < n && !(dst as usize + i).is_multiple_of(8) {
        // SAFETY: in bounds per the contract.
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(data[i], Ordering::Relaxed);
        i += 1;
    }
    while i + 8 <= n {
        let v = u64::from_ne_bytes(data[i..i + 8].try_into().expect("8 bytes"));
        // SAFETY: in bounds and 8-byte aligned.
        unsafe { AtomicU64::from_ptr(dst.add(i).cast::<u64>()) }.store(v, Ordering::Relaxed);
        i += 8;
    }
    while i < n {
        // SAFETY: in bounds per the contract.
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(data[i], Ordering::Relaxed);
        i += 1;
    }
}

// The registration contract: defined in the FFI layer, which relies on
// it, and re-exported by `memory` as part of the public API.
/// Memory whose address and length stay fixed while the value exists, so it
/// can be registered and owned by a [`Registration`](crate::Registration).
///
/// # Safety
/// `as_mut_ptr` must return a pointer valid for reads and writes of `len()`
/// bytes that does not change while the value lives, even when the value is
/// moved, and the value must own that memory exclusively. `Sync` is required
/// because a batch in flight holds a shared reference to the memory (for its
/// stream sync) and batches may be polled from any thread.
pub unsafe trait RegisterableMemory: Send + Sync + 'static {
    /// Start of the memory.
    fn as_mut_ptr(&mut self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the memory is empty (it cannot be registered then).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Makes work queued on this memory (a GPU stream) complete before a
    /// transfer reads or fills it; called at each submit that uses it.
    fn prepare_transfer(&self) -> Result<()> {
        Ok(())
    }
    /// Whether [`prepare_transfer`](Self::prepare_transfer) has work to do.
    fn needs_prepare(&self) -> bool {
        false
    }
}

/// Memory owned together with its registration. Dropping unregisters first
/// (waiting for in-flight transfers) and frees the memory after; if
/// unregistering fails the memory is leaked rather than freed.
pub(crate) struct OwnedRegion<M: RegisterableMemory> {
    region: RegisteredRegion,
    memory: ManuallyDrop<M>,
}

impl<M: RegisterableMemory> OwnedRegion<M> {
    pub(crate) fn new(
        engine: Arc<RawEngine>,
        mut memory: M,
        location: &str,
        remote_accessible: bool,
    ) -> Result<Self> {
        let ptr = memory.as_mut_ptr();
        let len = memory.len();
        // SAFETY: `RegisterableMemory` promises that `ptr` is valid for `len`
        // bytes and stays put while `memory` is alive, even when `memory` is
        // moved; we own `memory` and drop it only after the region is
        // unregistered (see `Drop`), and never hand out references to it
        // while registered.
        let region =
            unsafe { RegisteredRegion::register(engine, ptr, len, location, remote_accessible)? };
        Ok(Self {
            region,
            memory: ManuallyDrop::new(memory),
        })
    }

    /// Memory registered already (batch registration).
    ///
    /// # Safety
    /// `memory` must be registered with `engine` (`remote_accessible` as
    /// given), by nobody else.
    pub(crate) unsafe fn adopt(
        engine: Arc<RawEngine>,
        mut memory: M,
        remote_accessible: bool,
    ) -> Self {
        let ptr = memory.as_mut_ptr();
        let len = memory.len();
        // SAFETY: forwarded from this function's contract; `memory` stays
        // valid and put until the region is unregistered (see `new`).
        let region = unsafe { RegisteredRegion::adopt(engine, ptr, len, remote_accessible) };
        Self {
            region,
            memory: ManuallyDrop::new(memory),
        }
    }

    pub(crate) fn region(&self) -> &RegisteredRegion {
        &self.region
    }

    pub(crate) fn region_mut(&mut self) -> &mut RegisteredRegion {
        &mut self.region
    }

    pub(crate) fn memory(&self) -> &M {
        &self.memory
    }

    /// Unregisters and returns the memory.
    pub(crate) fn into_inner(mut self) -> Result<M> {
        self.region.unregister()?;
        // SAFETY: `memory` is taken exactly once; `self` is forgotten right
        // after, so `Drop` will not touch it again.
        let memory = unsafe { ManuallyDrop::take(&mut self.memory) };
        // The region is unregistered; dropping it does nothing more.
        // SAFETY: reading the region out of `self` before forgetting `self`
        // moves it exactly once.
        let region = unsafe { std::ptr::read(&self.region) };
        std::mem::forget(self);
        drop(region);
        Ok(memory)
    }
}

impl<M: RegisterableMemory> Drop for OwnedRegion<M> {
    fn drop(&mut self) {
        match self.region.unregister() {
            // SAFETY: unregistered, so neither the engine nor a peer touches
            // the memory any more; dropped exactly once.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.memory) },
            Err(e) => {
                tracing::error!(target: "mooncake", error = %e, "unregister failed; leaking the buffer");
                self.region.abandon();
            }
        }
    }
}

/// A registration of borrowed memory. Created only inside
/// `Engine::with_registered`, which keeps it on its stack and drops it before
/// the borrow ends, so it can never be leaked with the memory still
/// registered.
pub(crate) struct BorrowedRegion<'a> {
    region: RegisteredRegion,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> BorrowedRegion<'a> {
    pub(crate) fn new(
        engine: Arc<RawEngine>,
        buffer: &'a mut [u8],
        remote_accessible: bool,
    ) -> Result<Self> {
        // SAFETY: `buffer` is valid for its length for 'a, and exclusively
        // ours for 'a; the region is dropped (unregistered, which waits for
        // every transfer) before 'a ends, and aborts the process if that ever
        // fails (see `RegisteredRegion::drop`).
        let region = unsafe {
            RegisteredRegion::register(
                engine,
                buffer.as_mut_ptr(),
                buffer.len(),
                "*",
                remote_accessible,
            )?
        };
        Ok(Self {
            region,
            _borrow: PhantomData,
        })
    }

    /// Registers borrowed registrable memory (a GPU buffer, ...); hands the
    /// borrow back as a shared reference for its prepare hook.
    pub(crate) fn new_memory<M: RegisterableMemory>(
        engine: Arc<RawEngine>,
        memory: &'a mut M,
        remote_accessible: bool,
    ) -> Result<(Self, &'a M)> {
        let ptr = memory.as_mut_ptr();
        let len = memory.len();
        // SAFETY: as in `new`: `memory` is exclusively borrowed for 'a, its
        // address is stable (RegisterableMemory), and the region is
        // unregistered before 'a ends. The shared reborrow below is only
        // used for `prepare_transfer`, never to reach the bytes.
        let region =
            unsafe { RegisteredRegion::register(engine, ptr, len, "*", remote_accessible)? };
        Ok((
            Self {
                region,
                _borrow: PhantomData,
            },
            &*memory,
        ))
    }

    pub(crate) fn region(&self) -> &RegisteredRegion {
        &self.region
    }
}

/// Copies host bytes into a device allocation.
pub(crate) fn device_copy_in(a: &super::DeviceAlloc, offset: usize, data: &[u8]) -> Result<()> {
    if offset.checked_add(data.len()).is_none_or(|e| e > a.len()) {
        return Err(Error::InvalidArgument(format!(
            "{} bytes at offset {offset} exceed the device buffer of {}",
            data.len(),
            a.len()
        )));
    }
    // SAFETY: the range is inside the allocation (checked); `data` is host
    // memory valid for its length.
    unsafe { super::gpu::copy(a.ptr().add(offset), data.as_ptr(), data.len()) }
}

/// Copies device bytes out to host memory.
pub(crate) fn device_copy_out(a: &super::DeviceAlloc, offset: usize, out: &mut [u8]) -> Result<()> {
    if offset.checked_add(out.len()).is_none_or(|e| e > a.len()) {
        return Err(Error::InvalidArgument(format!(
            "{} bytes at offset {offset} exceed the device buffer of {}",
            out.len(),
            a.len()
        )));
    }
    // SAFETY: as above, copying the other way.
    unsafe { super::gpu::copy(out.as_mut_ptr(), a.ptr().add(offset), out.len()) }
}
