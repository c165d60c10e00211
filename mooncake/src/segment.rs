//! Remote segments.
use std::sync::Arc;

use crate::error::Result;
use crate::ffi::OwnedCString;
use crate::memory::{self, LocalMemory};
use crate::shared::EngineShared;

/// A buffer a remote segment publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteBuffer {
    /// Start address in the peer's process (what requests target).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

impl RemoteBuffer {
    /// Whether `[addr, addr + len)` lies inside this buffer.
    ///
    /// ```
    /// let buf = mooncake::RemoteBuffer { addr: 0x1000, len: 0x100 };
    /// assert!(buf.contains(0x1000, 0x100));
    /// assert!(!buf.contains(0x10f0, 0x20)); // runs past the end
    /// ```
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr + self.len)
    }
}

/// A remote segment opened by an engine.
///
/// [`Engine::open_segment`](crate::Engine::open_segment) opens a peer's
/// segment by its name; [`buffers`](Self::buffers) lists what it publishes,
/// and [`read_sync`](Self::read_sync) / [`write_sync`](Self::write_sync)
/// move one range without a [`Batch`](crate::Batch):
///
/// ```
/// use mooncake::{Access, Engine, LocalMemory};
///
/// # fn main() -> mooncake::Result<()> {
/// let target = Engine::builder().local_host("127.0.0.1").build()?;
/// let initiator = Engine::builder().local_host("127.0.0.1").build()?;
/// let published = target.register(vec![0u8; 4096], "*", Access::RemoteAccessible)?;
/// let mut local = initiator.register(vec![0u8; 4096], "*", Access::LocalOnly)?;
///
/// let peer = initiator.open_segment(target.segment_name())?;
/// assert_eq!(peer.name(), target.segment_name());
/// let remote = peer.buffers()?[0];
/// assert_eq!((remote.addr, remote.len), (published.addr(), 4096));
///
/// local.write_at(0, b"hello")?;
/// peer.write_sync(&local, 0, remote.addr + 100, 5)?; // local -> remote
/// peer.read_sync(&local, 10, remote.addr + 100, 5)?; // remote -> local
/// assert_eq!(&local.to_vec()[10..15], b"hello");
/// assert_eq!(&published.to_vec()[100..105], b"hello");
/// peer.close()?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RemoteSegment {
    pub(crate) engine: Arc<EngineShared>,
    pub(crate) id: i32,
    name: String,
}

impl std::fmt::Debug for RemoteSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSegment")
            .field("name", &self.name)
            .field("id", &self.id)
            .finish()
    }
}

impl RemoteSegment {
    pub(crate) fn open(engine: Arc<EngineShared>, name: &str, fresh: bool) -> Result<Self> {
        let c = OwnedCString::new("segment name", name)?;
        let id = engine.raw.open_segment(&c, fresh)?;
        tracing::debug!(target: "mooncake", segment = name, id, "segment opened");
        Ok(Self {
            engine,
            id,
            name: name.to_string(),
        })
    }

    pub(crate) fn local(engine: Arc<EngineShared>, name: &str) -> Self {
        Self {
            engine,
            id: mooncake_sys::LOCAL_SEGMENT as i32,
            name: name.to_string(),
        }
    }

    /// The name it was opened with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The engine's id for it (as in upstream's C API).
    pub fn id(&self) -> i32 {
        self.id
    }

    /// The buffers its descriptor lists (as last fetched).
    pub fn buffers(&self) -> Result<Vec<RemoteBuffer>> {
        Ok(self
            .engine
            .raw
            .segment_buffers(self.id)?
            .into_iter()
            .map(|b| RemoteBuffer {
                addr: b.addr,
                len: b.length,
            })
            .collect())
    }

    /// The transport protocol it uses (`"tcp"`, ...).
    pub fn protocol(&self) -> Result<String> {
        self.engine.raw.segment_protocol(self.id)
    }

    /// Re-fetches its descriptor (new buffers, a restarted peer).
    pub fn refresh(&mut self) -> Result<()> {
        let c = OwnedCString::new("segment name", &self.name)?;
        self.engine.raw.open_segment(&c, true)?;
        Ok(())
    }

    /// Checks that the owner answers on its handshake port.
    pub fn probe(&self) -> Result<()> {
        self.engine.raw.probe_segment(self.id)
    }

    /// Sends a notification to the owner now.
    pub fn notify(&self, name: &str, message: &str) -> Result<()> {
        let n = OwnedCString::new("notification name", name)?;
        let m = OwnedCString::new("notification message", message)?;
        self.engine.raw.notify(self.id, &n, &m)
    }

    /// Reads `len` bytes at `remote_addr` of this segment into
    /// `local[local_offset..]` and returns once the transfer is done (upstream's
    /// `transfer_sync_read`): one call, no batch to manage.
    pub fn read_sync<L: LocalMemory + ?Sized>(
        &self,
        local: &L,
        local_offset: usize,
        remote_addr: u64,
        len: usize,
    ) -> Result<()> {
        self.transfer_sync(
            mooncake_sys::OPCODE_READ,
            local,
            local_offset,
            remote_addr,
            len,
        )
    }

    /// Writes `local[local_offset..local_offset + len]` to `remote_addr` of
    /// this segment and returns once the transfer is done (upstream's
    /// `transfer_sync_write`).
    pub fn write_sync<L: LocalMemory + ?Sized>(
        &self,
        local: &L,
        local_offset: usize,
        remote_addr: u64,
        len: usize,
    ) -> Result<()> {
        self.transfer_sync(
            mooncake_sys::OPCODE_WRITE,
            local,
            local_offset,
            remote_addr,
            len,
        )
    }

    fn transfer_sync<L: LocalMemory + ?Sized>(
        &self,
        opcode: u32,
        local: &L,
        local_offset: usize,
        remote_addr: u64,
        len: usize,
    ) -> Result<()> {
        let ptr = memory::local_range(local, &self.engine.raw, local_offset, len)?;
        memory::prepare(local)?;
        let name = OwnedCString::new("segment name", &self.name)?;
        tracing::trace!(target: "mooncake", segment = %self.name, opcode, len, "synchronous transfer");
        self.engine
            .raw
            .transfer_sync(&name, opcode as i32, ptr, remote_addr, len as u64)
    }

    /// Closes the segment, as upstream's `closeSegment`: nothing is torn
    /// down (the engine keeps the descriptor cached and the id valid for
    /// other handles of the same segment).
    pub fn close(self) -> Result<()> {
        self.engine.raw.close_segment(self.id)
    }
}
