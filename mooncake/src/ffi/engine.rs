//! Calls into the engine's C ABI.
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::NonNull;
use std::time::Duration;

use mooncake_sys as sys;

use crate::error::{Error, ErrorCode, Result};
use crate::notify::Notification;

/// A `CString` built from caller input, with a clear error for interior NULs.
pub(crate) struct OwnedCString(CString);

impl OwnedCString {
    pub(crate) fn new(what: &str, s: &str) -> Result<Self> {
        CString::new(s)
            .map(Self)
            .map_err(|_| Error::InvalidArgument(format!("{what} contains a NUL byte: {s:?}")))
    }
    pub(crate) fn as_ptr(&self) -> *const c_char {
        self.0.as_ptr()
    }
}

/// The calling thread's last engine error.
pub(crate) fn last_error(fallback: c_int) -> Error {
    // SAFETY: both functions only read thread-local state; the message is a
    // NUL-terminated string valid until the next engine call on this thread,
    // and we copy it out immediately.
    let (code, msg) = unsafe {
        let code = sys::mc_last_error_code();
        let ptr = sys::mc_last_error_message();
        let msg = if ptr.is_null() {
            String::new()
        } else {
            CStr::from_ptr(ptr).to_string_lossy().into_owned()
        };
        (code, msg)
    };
    let code = if code != 0 { code } else { fallback };
    Error::Engine {
        code: ErrorCode::from_raw(code),
        message: if msg.is_empty() {
            "engine call failed".into()
        } else {
            msg
        },
    }
}

/// The last error, with the code taken from a positive status return value
/// (submit, free): those keep their own numbering.
fn last_status_error(status: c_int) -> Error {
    match last_error(-status) {
        Error::Engine { message, .. } => Error::Engine {
            code: ErrorCode::from_status(status),
            message,
        },
        other => other,
    }
}

pub(crate) fn check(rc: c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(last_error(rc))
    }
}

/// One engine handle. Destroyed on drop.
pub(crate) struct RawEngine {
    ptr: NonNull<c_void>,
}

// SAFETY: the engine is built for concurrent use: every C entry point takes
// its own locks or works on atomics, so the handle may be used from any
// thread and from several threads at once. Destruction happens only in
// `Drop`, when no other reference to this value exists.
unsafe impl Send for RawEngine {}
// SAFETY: see `Send` above; `&RawEngine` only gives access to the
// thread-safe C functions.
unsafe impl Sync for RawEngine {}

impl Drop for RawEngine {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from mc_engine_create and is destroyed once;
        // every child object holds an `Arc` to the owner of this value, so
        // none is alive any more.
        unsafe { sys::destroyTransferEngine(self.ptr.as_ptr()) }
    }
}

impl RawEngine {
    /// Creates an engine. `cfg` holds pointers into `strings`, which the
    /// caller keeps alive for the duration of the call.
    pub(crate) fn create(cfg: &sys::mc_engine_config_t) -> Result<Self> {
        // SAFETY: `cfg` is a fully initialised config whose string pointers
        // are NULL or point to live NUL-terminated strings; the engine copies
        // everything it keeps.
        let ptr = unsafe { sys::mc_engine_create(cfg) };
        NonNull::new(ptr)
            .map(|ptr| Self { ptr })
            .ok_or_else(|| last_error(sys::ERR_INVALID_ARGUMENT))
    }

    /// A config struct filled with the engine's defaults (and MC_* env).
    pub(crate) fn default_config() -> Result<sys::mc_engine_config_t> {
        let mut cfg = sys::mc_engine_config_t::default();
        // SAFETY: `cfg` is a valid, writable config struct.
        check(unsafe { sys::mc_engine_config_default(&mut cfg) })?;
        Ok(cfg)
    }

    pub(crate) fn handle(&self) -> sys::transfer_engine_t {
        self.ptr.as_ptr()
    }

    pub(crate) fn segment_name(&self) -> Result<String> {
        let mut buf = [0 as c_char; 512];
        let mut needed = 0usize;
        // SAFETY: `buf` is writable for its length; the engine NUL-terminates.
        check(unsafe {
            sys::mc_engine_segment_name(self.handle(), buf.as_mut_ptr(), buf.len(), &mut needed)
        })?;
        // SAFETY: the call succeeded, so `buf` holds a NUL-terminated string.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    pub(crate) fn memory_location(&self, addr: *const u8) -> Result<String> {
        let mut buf = [0 as c_char; 128];
        // SAFETY: `buf` is writable for its length; the engine only looks the
        // address up in its registry (it never dereferences it) and
        // NUL-terminates on success.
        check(unsafe {
            sys::mc_memory_location(self.handle(), addr.cast(), buf.as_mut_ptr(), buf.len())
        })?;
        // SAFETY: the call succeeded, so `buf` holds a NUL-terminated string.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    pub(crate) fn ports(&self) -> Result<(u16, u16)> {
        let (mut rpc, mut data) = (0u16, 0u16);
        // SAFETY: both out-pointers are valid.
        check(unsafe { sys::mc_engine_ports(self.handle(), &mut rpc, &mut data) })?;
        Ok((rpc, data))
    }

    pub(crate) fn gpu_registration_mode(&self) -> Result<i32> {
        let mut mode = 0i32;
        // SAFETY: `mode` is a valid out-pointer.
        check(unsafe { sys::mc_engine_gpu_registration_mode(self.handle(), &mut mode) })?;
        Ok(mode)
    }

    pub(crate) fn device_filters(&self) -> Result<(String, String)> {
        let mut allow = vec![0 as c_char; 4096];
        let mut deny = vec![0 as c_char; 4096];
        // SAFETY: both buffers are writable for their lengths; NUL-terminated
        // on success.
        check(unsafe {
            sys::mc_engine_device_filters(
                self.handle(),
                allow.as_mut_ptr(),
                allow.len(),
                deny.as_mut_ptr(),
                deny.len(),
            )
        })?;
        // SAFETY: NUL-terminated on success (checked above).
        let (a, d) = unsafe {
            (
                CStr::from_ptr(allow.as_ptr()),
                CStr::from_ptr(deny.as_ptr()),
            )
        };
        Ok((
            a.to_string_lossy().into_owned(),
            d.to_string_lossy().into_owned(),
        ))
    }

    /// Registers `len` bytes at `ptr`.
    ///
    /// # Safety
    /// The memory must stay valid, writable and unmoved until it is
    /// unregistered, and nothing else may free it meanwhile.
    pub(crate) unsafe fn register(
        &self,
        ptr: *mut u8,
        len: usize,
        location: &OwnedCString,
        remote_accessible: bool,
    ) -> Result<()> {
        // SAFETY: the caller upholds the memory contract; `location` is a live
        // C string that the engine copies.
        check(unsafe {
            sys::registerLocalMemory(
                self.handle(),
                ptr.cast(),
                len,
                location.as_ptr(),
                c_int::from(remote_accessible),
            )
        })
    }

    /// Unregisters the region starting at `ptr`; blocks until no transfer
    /// touches it.
    pub(crate) fn unregister(&self, ptr: *mut u8) -> Result<()> {
        // SAFETY: unregistering never touches the memory itself; an unknown
        // address is reported as an error.
        check(unsafe { sys::unregisterLocalMemory(self.handle(), ptr.cast()) })
    }

    pub(crate) fn wait_region_idle(&self, ptr: *mut u8, timeout: Option<Duration>) -> Result<()> {
        // SAFETY: only reads the engine's pin count for the region.
        check(unsafe { sys::mc_wait_region_idle(self.handle(), ptr.cast(), timeout_ms(timeout)) })
    }

    pub(crate) fn open_segment(&self, name: &OwnedCString, fresh: bool) -> Result<i32> {
        // SAFETY: `name` is a live C string that the engine copies.
        let id = unsafe {
            if fresh {
                sys::openSegmentNoCache(self.handle(), name.as_ptr())
            } else {
                sys::openSegment(self.handle(), name.as_ptr())
            }
        };
        if id < 0 {
            Err(last_error(sys::ERR_METADATA))
        } else {
            Ok(id)
        }
    }

    pub(crate) fn segment_buffers(&self, id: i32) -> Result<Vec<sys::mc_buffer_info_t>> {
        let mut count = 0usize;
        // SAFETY: a NULL output array with capacity 0 only queries the count.
        check(unsafe {
            sys::mc_segment_buffers(self.handle(), id, std::ptr::null_mut(), 0, &mut count)
        })?;
        let mut out = vec![sys::mc_buffer_info_t::default(); count];
        let mut written = 0usize;
        // SAFETY: `out` has room for `count` entries; the engine writes at
        // most `cap` of them.
        check(unsafe {
            sys::mc_segment_buffers(self.handle(), id, out.as_mut_ptr(), out.len(), &mut written)
        })?;
        out.truncate(written.min(count));
        Ok(out)
    }

    pub(crate) fn segment_protocol(&self, id: i32) -> Result<String> {
        let mut buf = [0 as c_char; 64];
        // SAFETY: `buf` is writable for its length; NUL-terminated on success.
        check(unsafe { sys::mc_segment_protocol(self.handle(), id, buf.as_mut_ptr(), buf.len()) })?;
        // SAFETY: NUL-terminated on success (checked above).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    pub(crate) fn probe_segment(&self, id: i32) -> Result<()> {
        // SAFETY: plain call with a segment id; unknown ids are errors.
        check(unsafe { sys::mc_segment_probe(self.handle(), id) })
    }

    /// Installs a transport ("tcp", "rdma"); idempotent.
    pub(crate) fn install_transport(&self, proto: &str) -> Result<()> {
        let p = OwnedCString::new("protocol", proto)?;
        // SAFETY: `p` is a live NUL-terminated string; `args` may be NULL.
        let t = unsafe { sys::installTransport(self.handle(), p.as_ptr(), std::ptr::null_mut()) };
        if t.is_null() {
            Err(last_error(sys::ERR_INVALID_ARGUMENT))
        } else {
            Ok(())
        }
    }

    /// A JSON text from one of the `mc_engine_rdma_*` functions, retried
    /// once with the size the engine asked for.
    fn rdma_json(
        &self,
        f: unsafe extern "C" fn(sys::transfer_engine_t, *mut c_char, usize, *mut usize) -> c_int,
    ) -> Result<String> {
        let mut buf = vec![0 as c_char; 16384];
        for _ in 0..2 {
            let mut needed = 0usize;
            // SAFETY: `buf` is writable for its length; the engine
            // NUL-terminates on success and only reports the size otherwise.
            let rc = unsafe { f(self.handle(), buf.as_mut_ptr(), buf.len(), &mut needed) };
            if rc == 0 {
                // SAFETY: the call succeeded, so `buf` holds a NUL-terminated string.
                return Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
                    .to_string_lossy()
                    .into_owned());
            }
            if needed < buf.len() {
                // Not a size problem: report the engine's error.
                check(rc)?;
                return Ok(String::new());
            }
            buf = vec![0 as c_char; needed + 1];
        }
        Err(last_error(sys::ERR_INVALID_ARGUMENT))
    }

    pub(crate) fn rdma_topology(&self) -> Result<String> {
        self.rdma_json(sys::mc_engine_rdma_topology)
    }

    pub(crate) fn rdma_counters(&self) -> Result<String> {
        self.rdma_json(sys::mc_engine_rdma_counters)
    }

    pub(crate) fn counters(&self) -> Result<sys::mc_engine_counters_t> {
        let mut out = sys::mc_engine_counters_t::default();
        // SAFETY: `out` is a writable struct of the declared layout.
        check(unsafe { sys::mc_engine_get_counters(self.handle(), &mut out) })?;
        Ok(out)
    }

    pub(crate) fn batch_counters(&self) -> Result<sys::mc_engine_batch_counters_t> {
        let mut out = sys::mc_engine_batch_counters_t::default();
        // SAFETY: `out` is a writable struct of the declared layout.
        check(unsafe { sys::mc_engine_get_batch_counters(self.handle(), &mut out) })?;
        Ok(out)
    }

    pub(crate) fn sync_segment_cache(&self) -> Result<()> {
        // SAFETY: plain call.
        check(unsafe { sys::syncSegmentCache(self.handle()) })
    }

    pub(crate) fn allocate_batch(&self, capacity: usize) -> Result<u64> {
        // SAFETY: plain call.
        let id = unsafe { sys::allocateBatchID(self.handle(), capacity) };
        if id == sys::INVALID_BATCH {
            Err(last_error(sys::ERR_INVALID_ARGUMENT))
        } else {
            Ok(id)
        }
    }

    /// Submits a block list as one task; returns the task's index. Safe to
    /// expose for the same reason as [`submit`](Self::submit): the engine
    /// refuses a list whose region's local blocks are not inside one
    /// registered region, and pins it until the task is finished.
    pub(crate) fn submit_blocks(
        &self,
        batch: u64,
        opcode: i32,
        target: i32,
        regions: &[sys::mc_block_region_t],
        local_ids: &[u64],
        remote_ids: &[u64],
    ) -> Result<usize> {
        if local_ids.len() != remote_ids.len() {
            return Err(crate::Error::InvalidArgument(
                "block list: id lists of different lengths".into(),
            ));
        }
        let mut task = 0usize;
        // SAFETY: the three arrays are valid for the lengths passed (the id
        // lists have one length, checked above) for the call's duration and
        // the engine copies what it needs; `task` is a live out-parameter.
        // The addresses inside the regions are range-checked by the engine
        // against this engine's registrations (local) and the peer's
        // published buffers (remote).
        let rc = unsafe {
            sys::mc_submit_blocks(
                self.handle(),
                batch,
                opcode,
                target,
                regions.as_ptr(),
                regions.len(),
                local_ids.as_ptr(),
                remote_ids.as_ptr(),
                local_ids.len(),
                &mut task,
            )
        };
        if rc == 0 {
            Ok(task)
        } else {
            Err(last_status_error(rc))
        }
    }

    /// Submits requests whose `source` pointers lie in registered memory.
    ///
    /// This is safe to expose to safe code: the engine refuses any request
    /// whose local range is not inside a registered region, and pins that
    /// region until the request is finished, so the memory cannot be
    /// unregistered (and therefore not freed) while the engine touches it.
    pub(crate) fn submit(
        &self,
        batch: u64,
        reqs: &mut [sys::transfer_request],
        notify: Option<(&OwnedCString, &OwnedCString)>,
    ) -> Result<()> {
        // SAFETY: `reqs` is a valid array for the call's duration (the engine
        // copies what it needs); see above for why the pointers inside are
        // sound; the notify strings are live C strings the engine copies.
        let rc = unsafe {
            match notify {
                None => sys::submitTransfer(self.handle(), batch, reqs.as_mut_ptr(), reqs.len()),
                Some((name, msg)) => sys::submitTransferWithNotify(
                    self.handle(),
                    batch,
                    reqs.as_mut_ptr(),
                    reqs.len(),
                    sys::notify_msg_t {
                        name: name.as_ptr().cast_mut(),
                        msg: msg.as_ptr().cast_mut(),
                    },
                ),
            }
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(last_status_error(rc))
        }
    }

    /// Waits for the batch; `Ok(false)` on timeout.
    pub(crate) fn wait_batch(&self, batch: u64, timeout: Option<Duration>) -> Result<bool> {
        // SAFETY: plain call; unknown batch ids are errors.
        let rc = unsafe { sys::mc_batch_wait(self.handle(), batch, timeout_ms(timeout)) };
        match rc {
            0 => Ok(true),
            sys::MC_ERR_TIMEOUT => Ok(false),
            _ => Err(last_error(rc)),
        }
    }

    /// The engine's readiness eventfd (owned by the engine, valid until it
    /// is destroyed), turned on by the first call.
    #[cfg(feature = "async")]
    pub(crate) fn event_fd(&self) -> Result<std::os::fd::RawFd> {
        let mut fd: c_int = -1;
        // SAFETY: `fd` is a valid out-pointer.
        check(unsafe { sys::mc_engine_event_fd(self.handle(), &mut fd) })?;
        Ok(fd)
    }

    /// Moves ids of finished batches into `ids`; returns how many, and
    /// whether ids were dropped (re-check every batch waited for).
    #[cfg(feature = "async")]
    pub(crate) fn take_completions(&self, ids: &mut [u64]) -> Result<(usize, bool)> {
        let (mut n, mut overflowed) = (0usize, 0 as c_int);
        // SAFETY: `ids` is writable for `ids.len()` entries; both
        // out-pointers are valid.
        check(unsafe {
            sys::mc_engine_take_completions(
                self.handle(),
                ids.as_mut_ptr(),
                ids.len(),
                &mut n,
                &mut overflowed,
            )
        })?;
        Ok((n.min(ids.len()), overflowed != 0))
    }

    /// Fills `out` with the first `out.len()` task statuses; returns the
    /// number of tasks submitted.
    pub(crate) fn batch_status(
        &self,
        batch: u64,
        out: &mut [sys::transfer_status],
    ) -> Result<usize> {
        let mut count = 0usize;
        // SAFETY: `out` is writable for its length; the engine writes at most
        // that many entries.
        check(unsafe {
            sys::mc_batch_status(
                self.handle(),
                batch,
                out.as_mut_ptr(),
                out.len(),
                &mut count,
            )
        })?;
        Ok(count)
    }

    /// Status of one task: O(1), whatever the batch size.
    pub(crate) fn task_status(&self, batch: u64, task: usize) -> Result<sys::transfer_status> {
        let mut out = sys::transfer_status::default();
        // SAFETY: `out` is a writable struct of the declared layout; an
        // unknown batch or task is an error, never an out-of-bounds read.
        check(unsafe { sys::getTransferStatus(self.handle(), batch, task, &mut out) })?;
        Ok(out)
    }

    pub(crate) fn transfer_error(&self, batch: u64, task: usize) -> Result<String> {
        // First with a buffer that fits any message the engine writes today,
        // then once more with the size it asks for.
        let mut len = 1024usize;
        loop {
            let mut buf = vec![0 as c_char; len];
            let mut needed = 0usize;
            // SAFETY: `buf` is writable for its length; the engine writes a
            // NUL-terminated string into it on success.
            let rc = unsafe {
                sys::mc_transfer_error(
                    self.handle(),
                    batch,
                    task,
                    buf.as_mut_ptr(),
                    buf.len(),
                    &mut needed,
                )
            };
            if rc == sys::MC_ERR_BUFFER_TOO_SMALL && needed >= len {
                len = needed + 1;
                continue;
            }
            check(rc)?;
            // SAFETY: NUL-terminated on success.
            return Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned());
        }
    }

    /// Empties a batch whose tasks were all seen terminal.
    pub(crate) fn reset_batch(&self, batch: u64) -> Result<()> {
        // SAFETY: plain call; the engine refuses busy or unknown batches.
        let rc = unsafe { sys::mc_batch_reset(self.handle(), batch) };
        if rc == 0 {
            Ok(())
        } else {
            Err(last_status_error(rc))
        }
    }

    pub(crate) fn free_batch(&self, batch: u64) -> Result<()> {
        // SAFETY: plain call; the engine refuses busy or unknown batches.
        let rc = unsafe { sys::freeBatchID(self.handle(), batch) };
        if rc == 0 {
            Ok(())
        } else {
            Err(last_status_error(rc))
        }
    }

    pub(crate) fn drain_notifications(&self) -> Result<Vec<Notification>> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the returned array (or NULL)
        // holds `n` entries with malloc'd strings, freed below.
        let msgs = unsafe { sys::getNotifsFromEngine(self.handle(), &mut n) };
        if msgs.is_null() {
            // SAFETY: reads thread-local state only.
            let code = unsafe { sys::mc_last_error_code() };
            return if code != 0 {
                Err(last_error(code))
            } else {
                Ok(Vec::new())
            };
        }
        let count = usize::try_from(n).unwrap_or(0);
        // SAFETY: `msgs` points to `count` initialised entries.
        let slice = unsafe { std::slice::from_raw_parts(msgs, count) };
        let out = slice
            .iter()
            .map(|m| Notification {
                // SAFETY: both strings are non-NULL, NUL-terminated (strdup).
                name: unsafe { CStr::from_ptr(m.name) }
                    .to_string_lossy()
                    .into_owned(),
                // SAFETY: as above.
                message: unsafe { CStr::from_ptr(m.msg) }
                    .to_string_lossy()
                    .into_owned(),
            })
            .collect();
        // SAFETY: returns the array and its strings to the engine's allocator,
        // exactly once; `slice` is not used afterwards.
        unsafe { sys::freeNotifsMsgBuf(msgs, n) };
        Ok(out)
    }

    pub(crate) fn notify(
        &self,
        segment: i32,
        name: &OwnedCString,
        msg: &OwnedCString,
    ) -> Result<()> {
        let id = u64::try_from(segment)
            .map_err(|_| Error::InvalidArgument("negative segment id".into()))?;
        // SAFETY: the strings are live C strings that the engine copies.
        check(unsafe {
            sys::genNotifyInEngine(
                self.handle(),
                id,
                sys::notify_msg_t {
                    name: name.as_ptr().cast_mut(),
                    msg: msg.as_ptr().cast_mut(),
                },
            )
        })
    }
}

fn timeout_ms(t: Option<Duration>) -> i64 {
    match t {
        None => -1,
        Some(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
    }
}

/// The engine's version string.
pub(crate) fn engine_version() -> &'static str {
    // SAFETY: returns a pointer to a static NUL-terminated string.
    unsafe { CStr::from_ptr(sys::mc_engine_version()) }
        .to_str()
        .unwrap_or("?")
}

/// The queued requests of a batch. The raw pointers inside are addresses of
/// registered memory, handed to the engine and never dereferenced by Rust.
#[derive(Default)]
pub(crate) struct RequestBuf(pub(crate) Vec<sys::transfer_request>);

// SAFETY: the buffer only stores addresses; moving or sharing it across
// threads gives no access to the memory they point to.
unsafe impl Send for RequestBuf {}
// SAFETY: see `Send`.
unsafe impl Sync for RequestBuf {}
