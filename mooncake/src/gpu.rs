//! GPU memory: what this build supports, owned device buffers, and DMA-BUF
//! export.
//!
//! Build with the `cuda12` or `cuda13` feature for the CUDA major of your
//! stack; the CUDA runtime is linked statically, so a binary needs only the
//! driver (`libcuda.so.1`) at run time. Without a GPU, or with a driver too
//! old for the build, host memory keeps working and GPU calls fail with an
//! error naming the build's major and the driver's version ([`info`]).
//!
//! Registered device memory works like host memory: [`DeviceBuffer`] (or a
//! cudarc `CudaSlice<u8>` with those features) goes into
//! [`Engine::register`](crate::Engine::register), and batches move it over
//! TCP (staged through pinned buffers), between engines on one host through
//! CUDA IPC, or within one engine by the copy engines.
use std::os::fd::OwnedFd;

use crate::error::Result;
use crate::ffi::{self, DeviceAlloc};
use crate::memory::LocalMemory;

/// The CUDA major this build targets (`Some(12)`, `Some(13)`), or None for
/// a CPU-only build.
pub const CUDA_MAJOR: Option<u32> = match mooncake_sys::CUDA_MAJOR {
    0 => None,
    m => Some(m),
};

/// What the engine found about GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// The CUDA major of the build (None: CPU build).
    pub build_cuda_major: Option<u32>,
    /// The statically linked runtime, e.g. 12090.
    pub runtime_version: i32,
    /// The driver's CUDA version, e.g. 13000 (0: no driver).
    pub driver_version: i32,
    /// GPUs visible.
    pub device_count: u32,
    /// Whether GPU memory can be used.
    pub usable: bool,
    /// Why not, when it cannot.
    pub reason: Option<String>,
}

/// Probes the GPU support (once per process; cheap afterwards).
pub fn info() -> GpuInfo {
    ffi::gpu_query()
}

/// An owned device allocation (`cudaMalloc`), registrable like a
/// [`HostBuffer`](crate::HostBuffer).
pub struct DeviceBuffer {
    pub(crate) alloc: DeviceAlloc,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.alloc.device())
            .field("addr", &format_args!("{:#x}", self.alloc.ptr() as usize))
            .field("len", &self.alloc.len())
            .finish()
    }
}

impl DeviceBuffer {
    /// Allocates `len` bytes on GPU `device`.
    pub fn new(device: u32, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(crate::Error::InvalidArgument(
                "a device buffer needs at least one byte".into(),
            ));
        }
        Ok(Self {
            alloc: DeviceAlloc::new(device, len)?,
        })
    }

    /// The GPU it lives on.
    pub fn device(&self) -> u32 {
        self.alloc.device()
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.alloc.len()
    }

    /// Whether it is empty (never).
    pub fn is_empty(&self) -> bool {
        self.alloc.len() == 0
    }

    /// Copies `data` to `offset`.
    pub fn copy_from_host(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        ffi::device_copy_in(&self.alloc, offset, data)
    }

    /// Copies `out.len()` bytes from `offset`.
    pub fn copy_to_host(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        ffi::device_copy_out(&self.alloc, offset, out)
    }
}

/// A DMA-BUF file descriptor for a device allocation (what RDMA registration
/// uses with `WITH_NVIDIA_PEERMEM=0`).
#[derive(Debug)]
pub struct Dmabuf {
    /// The fd; closed on drop.
    pub fd: OwnedFd,
    /// The GPU.
    pub device: u32,
    /// Offset of the exported range's start inside the allocation.
    pub offset: u64,
    /// Start of the allocation.
    pub base: u64,
    /// Size of the allocation.
    pub size: u64,
}

/// Exports the allocation behind registered GPU memory as a DMA-BUF.
pub fn export_dmabuf<L: LocalMemory + ?Sized>(
    memory: &L,
    offset: usize,
    len: usize,
) -> Result<Dmabuf> {
    let region = crate::memory::region_of(memory);
    if offset.checked_add(len).is_none_or(|e| e > region.len()) {
        return Err(crate::Error::InvalidArgument(format!(
            "range of {len} bytes at offset {offset} exceeds the registered {} bytes",
            region.len()
        )));
    }
    ffi::gpu_dmabuf_export(region.ptr().wrapping_add(offset), len)
}
