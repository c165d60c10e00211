//! GPU calls of the engine's C ABI (device memory, copies, DMA-BUF).
use std::ffi::{c_char, c_void, CStr};
use std::os::fd::{FromRawFd, OwnedFd};
use std::ptr::NonNull;

use mooncake_sys as sys;

use super::engine::last_error;
use crate::error::Result;

fn check(rc: i32) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(last_error(rc))
    }
}

/// The engine's GPU probe: its raw answer, whether the probe succeeded,
/// and the reason it gave (empty when none).
pub(crate) fn query() -> (sys::mc_gpu_info_t, bool, String) {
    let mut info = sys::mc_gpu_info_t::default();
    let mut reason = [0 as c_char; 512];
    // SAFETY: both out-parameters are valid for writing; the engine
    // NUL-terminates `reason`.
    let rc = unsafe { sys::mc_gpu_query(&mut info, reason.as_mut_ptr(), reason.len()) };
    // SAFETY: NUL-terminated (zero-initialised and written by snprintf).
    let reason = unsafe { CStr::from_ptr(reason.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    (info, rc == 0, reason)
}

/// The GPU that owns `ptr`, or None for host memory.
pub(crate) fn pointer_device(ptr: *const u8) -> Option<u32> {
    let mut dev = -1i32;
    // SAFETY: only classifies the address; never dereferences it.
    let rc = unsafe { sys::mc_gpu_pointer_device(ptr.cast(), &mut dev) };
    (rc == 0 && dev >= 0).then_some(dev as u32)
}

/// An owned cudaMalloc allocation.
pub(crate) struct DeviceAlloc {
    ptr: NonNull<u8>,
    len: usize,
    device: u32,
}

// SAFETY: device memory is not accessed through Rust references; the handle
// may move between threads.
unsafe impl Send for DeviceAlloc {}
// SAFETY: `&DeviceAlloc` only allows copies through the engine's
// synchronous GPU copies.
unsafe impl Sync for DeviceAlloc {}

impl DeviceAlloc {
    pub(crate) fn new(device: u32, len: usize) -> Result<Self> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        check(unsafe { sys::mc_gpu_alloc(device as i32, len, &mut p) })?;
        let ptr = NonNull::new(p.cast::<u8>())
            .expect("mc_gpu_alloc returned success with a null pointer");
        Ok(Self { ptr, len, device })
    }
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    pub(crate) fn device(&self) -> u32 {
        self.device
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated by mc_gpu_alloc on `device`, freed once.
        unsafe { sys::mc_gpu_free(self.device as i32, self.ptr.as_ptr().cast()) };
    }
}

/// Synchronous copy of `len` bytes between any host and device addresses.
///
/// # Safety
/// Both ranges must be valid for `len` bytes in their memory (host or
/// device) for the duration of the call, and `dst` writable.
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> Result<()> {
    // SAFETY: forwarded from the caller's contract.
    check(unsafe { sys::mc_gpu_memcpy(dst.cast(), src.cast(), len) })
}

/// # Safety
/// `dst..dst+len` must be valid device memory of `device`.
pub(crate) unsafe fn memset(device: u32, dst: *mut u8, value: u8, len: usize) -> Result<()> {
    // SAFETY: forwarded from the caller's contract.
    check(unsafe { sys::mc_gpu_memset(device as i32, dst.cast(), i32::from(value), len) })
}

/// Exports the allocation holding `ptr..ptr+len`: the fd, now ours, and the
/// engine's description of the range.
pub(crate) fn dmabuf_export(ptr: *const u8, len: usize) -> Result<(OwnedFd, sys::mc_dmabuf_t)> {
    let mut out = sys::mc_dmabuf_t::default();
    // SAFETY: only reads the allocation's attributes; `out` is writable.
    check(unsafe { sys::mc_gpu_dmabuf_export(ptr.cast(), len, &mut out) })?;
    // SAFETY: on success the engine hands us a fresh fd that nobody else
    // owns.
    let fd = unsafe { OwnedFd::from_raw_fd(out.fd) };
    Ok((fd, out))
}
