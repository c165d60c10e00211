//! Page-aligned host allocations (what `HostBuffer` owns).
use std::alloc::{self, Layout};
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// The system page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc_sysconf_pagesize() };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

extern "C" {
    #[link_name = "getpagesize"]
    fn libc_sysconf_pagesize() -> std::ffi::c_int;
}

/// An owned, zero-initialised, page-aligned allocation.
pub(crate) struct PageAlignedAlloc {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the allocation is uniquely owned; moving the owner to another
// thread moves exclusive access with it.
unsafe impl Send for PageAlignedAlloc {}
// SAFETY: shared references only allow reads (`as_slice`).
unsafe impl Sync for PageAlignedAlloc {}

impl PageAlignedAlloc {
    pub(crate) fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "a host buffer needs at least one byte".into(),
            ));
        }
        let layout = Layout::from_size_align(len, page_size())
            .map_err(|e| Error::InvalidArgument(format!("host buffer of {len} bytes: {e}")))?;
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "out of memory allocating a host buffer of {len} bytes"
            ))
        })?;
        Ok(Self { ptr, layout })
    }

    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid and initialised (zeroed) for `len` bytes, and
        // `&self` excludes writers through this owner.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len()) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len()) }
    }
}

impl Drop for PageAlignedAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this very layout; freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
