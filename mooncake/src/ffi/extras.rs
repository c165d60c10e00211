//! The calls that match upstream's remaining API: engine-allocated
//! (managed) buffers, one-call synchronous transfers, batch registration,
//! segment closing, graceful shutdown and the NIC and link diagnostics.
use std::ffi::{c_char, c_int, CStr};
use std::sync::Arc;

use mooncake_sys as sys;

use crate::error::{Error, Result};

use super::engine::{check, last_error, OwnedCString, RawEngine};
use super::memory::{OwnedRegion, RegisterableMemory, RegisteredRegion};

/// One NIC's load, as `getNicLoadStats` reports it.
pub(crate) struct NicLoad {
    pub(crate) device: String,
    pub(crate) inflight_bytes: u64,
    pub(crate) ewma_bandwidth_bps: f64,
}

impl RawEngine {
    /// Allocates and registers `len` bytes owned by the engine.
    pub(crate) fn alloc_managed(
        self: &Arc<Self>,
        len: usize,
        location: &str,
    ) -> Result<RegisteredRegion> {
        let loc = OwnedCString::new("location", location)?;
        let mut ptr: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: `loc` is a live C string the engine copies; `ptr` is a
        // valid out-pointer.
        check(unsafe { sys::mc_managed_buffer_alloc(self.handle(), len, loc.as_ptr(), &mut ptr) })?;
        // SAFETY: the engine mapped `len` bytes at `ptr` (readable,
        // writable, zeroed) and keeps them until `mc_managed_buffer_free`,
        // which only the returned region calls (at its unregister).
        Ok(unsafe { RegisteredRegion::adopt_managed(self.clone(), ptr.cast(), len) })
    }

    /// Unregisters and unmaps a managed buffer; blocks until no transfer
    /// touches it.
    pub(crate) fn free_managed(&self, ptr: *mut u8, len: usize) -> Result<()> {
        // SAFETY: the engine checks that `ptr` is one of its managed buffers
        // of `len` bytes and refuses anything else.
        check(unsafe { sys::mc_managed_buffer_free(self.handle(), ptr.cast(), len) })
    }

    /// One synchronous transfer between registered local memory at `local`
    /// and `remote` in segment `target`.
    ///
    /// Sound for the same reason as `submit`: the engine refuses a local
    /// range outside registered memory and pins the region for the
    /// transfer, and the caller's borrow keeps the registration alive
    /// until this call returns (the transfer is finished by then).
    pub(crate) fn transfer_sync(
        &self,
        target: &OwnedCString,
        opcode: c_int,
        local: *mut u8,
        remote: u64,
        len: u64,
    ) -> Result<()> {
        // SAFETY: see above; `target` is a live C string the engine copies.
        check(unsafe {
            sys::mc_transfer_sync(
                self.handle(),
                target.as_ptr(),
                opcode,
                local.cast(),
                remote,
                len,
            )
        })
    }

    /// Registers every memory with one call (one descriptor update), all or
    /// nothing, remote-accessible, and hands back the registrations.
    pub(crate) fn register_batch<M: RegisterableMemory>(
        self: &Arc<Self>,
        mut memories: Vec<M>,
        location: &str,
    ) -> Result<Vec<OwnedRegion<M>>> {
        if memories.iter().any(|m| m.is_empty()) {
            return Err(Error::InvalidArgument(
                "cannot register an empty buffer".into(),
            ));
        }
        let loc = OwnedCString::new("location", location)?;
        let mut entries: Vec<sys::buffer_entry_t> = memories
            .iter_mut()
            .map(|m| sys::buffer_entry_t {
                addr: m.as_mut_ptr().cast(),
                length: m.len(),
            })
            .collect();
        // SAFETY: `RegisterableMemory` promises each pointer is valid for its
        // length and stays put while the memory lives, even when moved; the
        // memories are owned by the returned regions, which unregister
        // before freeing them. `entries` and `loc` outlive the call.
        check(unsafe {
            sys::registerLocalMemoryBatch(
                self.handle(),
                entries.as_mut_ptr(),
                entries.len(),
                loc.as_ptr(),
            )
        })?;
        Ok(memories
            .into_iter()
            .map(|m| {
                // SAFETY: registered just above, remote-accessible, by this
                // engine; the region takes over unregistering it.
                unsafe { OwnedRegion::adopt(self.clone(), m, true) }
            })
            .collect())
    }

    /// `closeSegment`: the id stays valid, as upstream.
    pub(crate) fn close_segment(&self, id: i32) -> Result<()> {
        // SAFETY: plain call; an unknown id is reported as an error.
        check(unsafe { sys::closeSegment(self.handle(), id) })
    }

    pub(crate) fn enable_graceful_shutdown(&self) {
        // SAFETY: plain call on a live handle.
        unsafe { sys::enableGracefulShutdown(self.handle()) }
    }

    pub(crate) fn nic_load_stats(&self) -> Result<Vec<NicLoad>> {
        let mut cap = 16usize;
        loop {
            // SAFETY: all-zero is a valid nic_load_stat_t (bytes and numbers).
            let mut stats: Vec<sys::nic_load_stat_t> = vec![unsafe { std::mem::zeroed() }; cap];
            let mut count = cap;
            // SAFETY: `stats` has room for `count` entries.
            let rc = unsafe { sys::getNicLoadStats(self.handle(), stats.as_mut_ptr(), &mut count) };
            if rc != 0 {
                return Err(last_error(rc));
            }
            if count > cap {
                cap = count;
                continue;
            }
            stats.truncate(count);
            return Ok(stats
                .iter()
                .map(|s| NicLoad {
                    // SAFETY: the engine NUL-terminates device_name within its 64 bytes.
                    device: unsafe { CStr::from_ptr(s.device_name.as_ptr()) }
                        .to_string_lossy()
                        .into_owned(),
                    inflight_bytes: s.inflight_bytes,
                    ewma_bandwidth_bps: s.ewma_bandwidth_bps,
                })
                .collect());
        }
    }

    pub(crate) fn show_links(&self, json: bool) -> Result<String> {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            // SAFETY: `buf` is writable for its length; the engine
            // NUL-terminates what it writes.
            let rc = unsafe {
                sys::showLinks(
                    self.handle(),
                    buf.as_mut_ptr().cast::<c_char>(),
                    buf.len(),
                    c_int::from(json),
                )
            };
            check(rc)?;
            let text = CStr::from_bytes_until_nul(&buf)
                .map_err(|_| Error::InvalidArgument("showLinks wrote no terminator".into()))?;
            // Truncated when it filled the buffer: try a bigger one.
            if text.to_bytes().len() + 1 < buf.len() || buf.len() >= 1 << 24 {
                return Ok(text.to_string_lossy().into_owned());
            }
            buf = vec![0u8; buf.len() * 4];
        }
    }

    pub(crate) fn discover_topology(&self) -> Result<()> {
        // SAFETY: plain call.
        check(unsafe { sys::discoverTopology(self.handle()) })
    }

    pub(crate) fn uninstall_transport(&self, proto: &str) -> Result<()> {
        let p = OwnedCString::new("protocol", proto)?;
        // SAFETY: `p` is a live C string the engine copies.
        check(unsafe { sys::uninstallTransport(self.handle(), p.as_ptr()) })
    }

    pub(crate) fn transports(&self) -> Result<u32> {
        let mut p = 0u32;
        // SAFETY: `p` is a valid out-pointer.
        check(unsafe { sys::mc_engine_transports(self.handle(), &mut p) })?;
        Ok(p)
    }
}
