//! Registered memory.
//!
//! Memory must be registered with an engine before a transfer may use it,
//! as a source or destination on this side, or as a target a peer reads or
//! writes. Two ways to register, both impossible to misuse from safe code:
//!
//! - [`Registration`] owns its memory ([`HostBuffer`], `Vec<u8>`,
//!   `Box<[u8]>`): dropping it unregisters, waiting for transfers in flight,
//!   and only then frees the memory.
//! - [`Engine::with_registered`](crate::Engine::with_registered) registers a
//!   borrowed `&mut [u8]` for the duration of a closure.
//!
//! Batches borrow the registrations they use, so a registration cannot be
//! dropped or written through `&mut` while a batch that uses it is alive.
//! Even a leaked batch (`mem::forget`) cannot cause a use-after-free: the
//! engine pins a registration while any transfer touches it, and
//! unregistering waits for those pins.
//!
//! Registered memory is shared with DMA and, when remote-accessible, with
//! peers, so this crate never hands out `&[u8]` to remote-accessible memory:
//! read and write it with [`Registration::read_at`],
//! [`Registration::write_at`] and [`Registration::write_shared`] (copies that
//! use atomic accesses where they may run concurrently), or take the memory
//! back with [`Registration::into_inner`]. Bytes copied out while a transfer
//! writes them are unspecified (not undefined).
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
pub use crate::ffi::RegisterableMemory;
use crate::ffi::{BorrowedRegion, OwnedRegion, PageAlignedAlloc, RegisteredRegion};
use crate::shared::EngineShared;

/// Whether peers may read and write a registered buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Only this engine's own transfers use it (as source or destination).
    LocalOnly,
    /// Published in the segment descriptor: peers may READ and WRITE it.
    RemoteAccessible,
}

/// Whether a region registered with `access` is published to peers (the
/// FFI layer speaks in that flag).
fn remotely(access: Access) -> bool {
    access == Access::RemoteAccessible
}

fn access_of(region: &RegisteredRegion) -> Access {
    if region.remote_accessible() {
        Access::RemoteAccessible
    } else {
        Access::LocalOnly
    }
}

/// A zero-initialised, page-aligned host buffer: the usual memory to
/// register.
///
/// Fill it through `&mut [u8]` before registering it; once registered, its
/// bytes are reached through the [`Registration`]:
///
/// ```
/// use mooncake::{Access, Engine, HostBuffer};
///
/// # fn main() -> mooncake::Result<()> {
/// let mut buf = HostBuffer::new(1 << 20)?;
/// assert_eq!(buf.as_ptr() as usize % HostBuffer::alignment(), 0);
/// assert!(buf.iter().all(|b| *b == 0));
/// buf[..4].copy_from_slice(b"kv-0");
///
/// let engine = Engine::builder().local_host("127.0.0.1").build()?;
/// let reg = engine.register(buf, "*", Access::RemoteAccessible)?;
/// let mut head = [0u8; 4];
/// reg.read_at(0, &mut head)?;
/// assert_eq!(&head, b"kv-0");
/// # Ok(())
/// # }
/// ```
pub struct HostBuffer {
    alloc: PageAlignedAlloc,
}

impl HostBuffer {
    /// Allocates `len` zeroed bytes aligned to the page size.
    pub fn new(len: usize) -> Result<Self> {
        Ok(Self {
            alloc: PageAlignedAlloc::new(len)?,
        })
    }

    /// The page size used for alignment.
    pub fn alignment() -> usize {
        crate::ffi::page_size()
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffer")
            .field("addr", &self.alloc.as_ptr())
            .field("len", &self.alloc.len())
            .finish()
    }
}

impl Deref for HostBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.alloc.as_slice()
    }
}

impl DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.alloc.as_mut_slice()
    }
}

// SAFETY: a HostBuffer's allocation never moves while the value exists, it
// is valid for `len()` bytes, and the value owns it exclusively.
unsafe impl RegisterableMemory for HostBuffer {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.alloc.as_ptr()
    }
    fn len(&self) -> usize {
        self.alloc.len()
    }
}

// SAFETY: a Vec's heap buffer does not move when the Vec is moved, and it is
// never reallocated while we own it (nothing can push to it).
unsafe impl RegisterableMemory for Vec<u8> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        Vec::as_mut_ptr(self)
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

// SAFETY: a boxed slice's heap buffer does not move when the box is moved.
unsafe impl RegisterableMemory for Box<[u8]> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        <[u8]>::as_mut_ptr(self)
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

mod sealed {
    pub trait Sealed {
        fn region(&self) -> &crate::ffi::RegisteredRegion;
        fn needs_prepare(&self) -> bool {
            false
        }
        fn prepare(&self) -> crate::Result<()> {
            Ok(())
        }
    }
}

pub(crate) fn region_of<L: LocalMemory + ?Sized>(l: &L) -> &RegisteredRegion {
    sealed::Sealed::region(l)
}

/// The address of `local[offset..offset + len]`, after checking that `local`
/// is registered with `engine` and that the range is non-empty and inside
/// it: the one check every transfer path makes on caller-supplied local
/// ranges.
pub(crate) fn local_range<L: LocalMemory + ?Sized>(
    local: &L,
    engine: &Arc<crate::ffi::RawEngine>,
    offset: usize,
    len: usize,
) -> Result<*mut u8> {
    let region = region_of(local);
    if !Arc::ptr_eq(region.engine(), engine) {
        return Err(crate::Error::InvalidArgument(
            "local memory is registered with another engine".into(),
        ));
    }
    if len == 0 {
        return Err(crate::Error::InvalidArgument(
            "a transfer needs at least one byte".into(),
        ));
    }
    if offset.checked_add(len).is_none_or(|end| end > local.len()) {
        return Err(crate::Error::InvalidArgument(format!(
            "local range of {len} bytes at offset {offset} exceeds the registered {} bytes",
            local.len()
        )));
    }
    Ok(region.ptr().wrapping_add(offset))
}

pub(crate) fn needs_prepare<L: LocalMemory + ?Sized>(l: &L) -> bool {
    sealed::Sealed::needs_prepare(l)
}

pub(crate) fn prepare<L: LocalMemory + ?Sized>(l: &L) -> Result<()> {
    sealed::Sealed::prepare(l)
}

/// Registered local memory that a batch request can use: [`Registration`]
/// or [`RegisteredSlice`]. Sealed. `Sync` because a [`Batch`](crate::Batch)
/// keeps references to the memory it uses and is itself `Send`.
pub trait LocalMemory: sealed::Sealed + Sync {
    /// Length in bytes.
    fn len(&self) -> usize {
        self.region().len()
    }
    /// Whether the memory is empty (never true for a registration).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Start address (what a peer passes as the remote address).
    fn addr(&self) -> u64 {
        self.region().addr()
    }
    /// Whether peers may access it.
    fn access(&self) -> Access {
        access_of(self.region())
    }
    /// The GPU it lives on, or None for host memory.
    fn device(&self) -> Option<u32> {
        self.region().device()
    }
}

/// Registered memory owned by the registration.
///
/// Any [`RegisterableMemory`] registers: a [`HostBuffer`], a `Vec<u8>`, a
/// `Box<[u8]>` (or GPU memory, see [`gpu`](crate::gpu)).
/// [`Access::LocalOnly`] memory is only a source or destination of this
/// engine's own transfers, so its bytes can be borrowed directly
/// ([`local_slice_mut`](Self::local_slice_mut));
/// [`Access::RemoteAccessible`] memory is published to peers and is only
/// copied in and out.
///
/// ```
/// use mooncake::{Access, Engine, LocalMemory};
///
/// # fn main() -> mooncake::Result<()> {
/// let engine = Engine::builder().local_host("127.0.0.1").build()?;
///
/// let mut scratch = engine.register(vec![0u8; 4096], "*", Access::LocalOnly)?;
/// assert_eq!((scratch.len(), scratch.access()), (4096, Access::LocalOnly));
/// scratch.local_slice_mut(None)?[..3].copy_from_slice(b"abc");
///
/// let mut published = engine.register(vec![0u8; 4096], "*", Access::RemoteAccessible)?;
/// assert!(published.local_slice_mut(None).is_err()); // peers may write it any time
/// published.write_at(8, b"xyz")?;
/// let mut out = [0u8; 3];
/// published.read_at(8, &mut out)?;
/// assert_eq!(&out, b"xyz");
///
/// // Unregister and take the memory back.
/// let vec: Vec<u8> = scratch.into_inner()?;
/// assert_eq!(&vec[..3], b"abc");
/// # Ok(())
/// # }
/// ```
pub struct Registration<M: RegisterableMemory> {
    inner: OwnedRegion<M>,
}

impl<M: RegisterableMemory> std::fmt::Debug for Registration<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self.inner.region();
        f.debug_struct("Registration")
            .field("addr", &format_args!("{:#x}", r.addr()))
            .field("len", &r.len())
            .field("access", &access_of(r))
            .finish()
    }
}

impl<M: RegisterableMemory> Registration<M> {
    pub(crate) fn new(
        engine: Arc<EngineShared>,
        memory: M,
        location: &str,
        access: Access,
    ) -> Result<Self> {
        Ok(Self {
            inner: OwnedRegion::new(engine.raw.clone(), memory, location, remotely(access))?,
        })
    }

    /// Copies `out.len()` bytes starting at `offset` out of the buffer.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.inner.region().read_at(offset, out)
    }

    /// Where the engine says this buffer lives, as published to peers:
    /// `cuda:<device>` for GPU memory, `cpu:<numa node>` for host memory
    /// (or the location given at registration).
    pub fn location(&self) -> Result<String> {
        self.inner.region().location()
    }

    /// Copies the whole buffer into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        self.inner
            .region()
            .read_at(0, &mut v)
            .expect("whole range is in bounds");
        v
    }

    /// Copies `data` into the buffer at `offset`.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        self.inner.region_mut().write_at(offset, data)
    }

    /// Copies `data` into the buffer at `offset` through a shared reference,
    /// with relaxed atomic stores: threads may fill different parts of one
    /// registration while batches transfer other parts (a KV cache being
    /// computed block by block while finished blocks are sent). Writing bytes
    /// that a transfer is reading at the same time sends unspecified bytes;
    /// it is never undefined behaviour.
    pub fn write_shared(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.inner.region().write_shared(offset, data)
    }

    /// Sets every byte of the buffer (e.g. to poison it before a test).
    pub fn fill(&mut self, byte: u8) -> Result<()> {
        self.inner.region_mut().fill(byte)
    }

    /// The bytes of a [`Access::LocalOnly`] buffer, after waiting up to
    /// `timeout` (None: forever) for any transfer still touching it.
    /// Remote-accessible buffers are refused: peers may write them at any
    /// time.
    pub fn local_slice_mut(&mut self, timeout: Option<Duration>) -> Result<&mut [u8]> {
        self.inner.region_mut().local_slice_mut(timeout)
    }

    /// Unregisters (waiting for transfers in flight) and returns the memory.
    pub fn into_inner(self) -> Result<M> {
        self.inner.into_inner()
    }
}

impl<M: RegisterableMemory> sealed::Sealed for Registration<M> {
    fn region(&self) -> &RegisteredRegion {
        self.inner.region()
    }
    fn needs_prepare(&self) -> bool {
        self.inner.memory().needs_prepare()
    }
    fn prepare(&self) -> Result<()> {
        self.inner.memory().prepare_transfer()
    }
}
impl<M: RegisterableMemory> LocalMemory for Registration<M> {}

/// A borrowed buffer registered for the duration of
/// [`Engine::with_registered`](crate::Engine::with_registered).
///
/// Any `&mut [u8]` registers this way, a part of a larger buffer included;
/// once the closure returns, it is unregistered and the bytes that
/// transfers wrote are there to read:
///
/// ```
/// use mooncake::{Access, Engine};
///
/// # fn main() -> mooncake::Result<()> {
/// let target = Engine::builder().local_host("127.0.0.1").build()?;
/// let initiator = Engine::builder().local_host("127.0.0.1").build()?;
/// let _published = target.register(vec![9u8; 4096], "*", Access::RemoteAccessible)?;
/// let peer = initiator.open_segment(target.segment_name())?;
/// let remote = peer.buffers()?[0];
///
/// let mut frame = vec![0u8; 8192];
/// // `??`: the registration's result, then the read's.
/// initiator.with_registered(&mut frame[4096..], Access::LocalOnly, |slice| {
///     peer.read_sync(slice, 0, remote.addr, 4096)
/// })??;
/// assert!(frame[..4096].iter().all(|b| *b == 0));
/// assert!(frame[4096..].iter().all(|b| *b == 9));
/// # Ok(())
/// # }
/// ```
pub struct RegisteredSlice<'a> {
    inner: BorrowedRegion<'a>,
    // The borrowed memory's own hook (GPU stream sync), when it has one.
    prepare: Option<&'a dyn RegisterableMemory>,
}

impl<'a> RegisteredSlice<'a> {
    pub(crate) fn new(
        engine: Arc<EngineShared>,
        buffer: &'a mut [u8],
        access: Access,
    ) -> Result<Self> {
        Ok(Self {
            inner: BorrowedRegion::new(engine.raw.clone(), buffer, remotely(access))?,
            prepare: None,
        })
    }

    pub(crate) fn new_memory<M: RegisterableMemory>(
        engine: Arc<EngineShared>,
        memory: &'a mut M,
        access: Access,
    ) -> Result<Self> {
        let (inner, memory) =
            BorrowedRegion::new_memory(engine.raw.clone(), memory, remotely(access))?;
        let prepare = memory
            .needs_prepare()
            .then_some(memory as &dyn RegisterableMemory);
        Ok(Self { inner, prepare })
    }

    /// Copies `out.len()` bytes starting at `offset` out of the buffer.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.inner.region().read_at(offset, out)
    }

    /// Where the engine says this buffer lives, as published to peers:
    /// `cuda:<device>` for GPU memory, `cpu:<numa node>` for host memory
    /// (or the location given at registration).
    pub fn location(&self) -> Result<String> {
        self.inner.region().location()
    }
}

impl std::fmt::Debug for RegisteredSlice<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self.inner.region();
        f.debug_struct("RegisteredSlice")
            .field("addr", &format_args!("{:#x}", r.addr()))
            .field("len", &r.len())
            .field("access", &access_of(r))
            .finish()
    }
}

impl sealed::Sealed for RegisteredSlice<'_> {
    fn region(&self) -> &RegisteredRegion {
        self.inner.region()
    }
    fn needs_prepare(&self) -> bool {
        self.prepare.is_some()
    }
    fn prepare(&self) -> Result<()> {
        self.prepare.map_or(Ok(()), |m| m.prepare_transfer())
    }
}
impl LocalMemory for RegisteredSlice<'_> {}

impl<M: RegisterableMemory> Registration<M> {
    /// Registers every memory with one engine call (`registerLocalMemoryBatch`:
    /// one descriptor update, all or nothing), remote-accessible.
    pub(crate) fn new_batch(
        engine: Arc<EngineShared>,
        memories: Vec<M>,
        location: &str,
    ) -> Result<Vec<Self>> {
        Ok(engine
            .raw
            .register_batch(memories, location)?
            .into_iter()
            .map(|inner| Self { inner })
            .collect())
    }
}

/// A buffer the engine allocated and registered (upstream's managed buffer,
/// `allocate_managed_buffer`): page-aligned, zeroed, remote-accessible.
/// Dropping it unregisters it (waiting for transfers that touch it) and the
/// engine frees it.
///
/// ```
/// use mooncake::{Access, Engine, LocalMemory};
///
/// # fn main() -> mooncake::Result<()> {
/// let target = Engine::builder().local_host("127.0.0.1").build()?;
/// let initiator = Engine::builder().local_host("127.0.0.1").build()?;
/// let mut managed = target.alloc_managed(4096, "*")?;
/// assert_eq!(managed.access(), Access::RemoteAccessible);
/// managed.write_at(0, b"from the target")?;
///
/// let local = initiator.alloc_managed(4096, "*")?;
/// let peer = initiator.open_segment(target.segment_name())?;
/// peer.read_sync(&local, 0, managed.addr(), 15)?;
/// assert_eq!(&local.to_vec()[..15], b"from the target");
/// # Ok(())
/// # }
/// ```
pub struct ManagedBuffer {
    region: RegisteredRegion,
}

impl ManagedBuffer {
    pub(crate) fn new(engine: Arc<EngineShared>, len: usize, location: &str) -> Result<Self> {
        let region = engine.raw.alloc_managed(len, location)?;
        tracing::debug!(target: "mooncake", addr = region.addr(), len, "managed buffer allocated");
        Ok(Self { region })
    }

    /// Copies `out.len()` bytes starting at `offset` out of the buffer.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.region.read_at(offset, out)
    }

    /// Copies `data` into the buffer at `offset`.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        self.region.write_at(offset, data)
    }

    /// Copies `data` in through a shared reference, with relaxed atomic
    /// stores (see [`Registration::write_shared`]).
    pub fn write_shared(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.region.write_shared(offset, data)
    }

    /// Sets every byte of the buffer.
    pub fn fill(&mut self, byte: u8) -> Result<()> {
        self.region.fill(byte)
    }

    /// Copies the whole buffer into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.region.len()];
        self.region
            .read_at(0, &mut v)
            .expect("whole range is in bounds");
        v
    }

    /// Where the engine says this buffer lives, as published to peers.
    pub fn location(&self) -> Result<String> {
        self.region.location()
    }
}

impl std::fmt::Debug for ManagedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedBuffer")
            .field("addr", &format_args!("{:#x}", self.region.addr()))
            .field("len", &self.region.len())
            .finish()
    }
}

impl sealed::Sealed for ManagedBuffer {
    fn region(&self) -> &RegisteredRegion {
        &self.region
    }
}
impl LocalMemory for ManagedBuffer {}
