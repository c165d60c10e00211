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
//! cudarc `CudaSlice<u8>` with the `cudarc` feature) goes into
//! [`Engine::register`](crate::Engine::register), and batches move it over
//! TCP (staged through pinned buffers), between engines on one host through
//! CUDA IPC, or within one engine by the copy engines.
use std::os::fd::OwnedFd;

use crate::error::{Error, Result};
use crate::ffi::{self, DeviceAlloc};
use crate::memory::{LocalMemory, RegisterableMemory};

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
///
/// Safe to call in any build, with or without a GPU:
///
/// ```
/// let info = mooncake::gpu::info();
/// assert_eq!(info.build_cuda_major, mooncake::gpu::CUDA_MAJOR);
/// if !info.usable {
///     // A CPU-only build, no GPU, or a driver too old for the build.
///     assert!(info.reason.is_some());
/// }
/// ```
pub fn info() -> GpuInfo {
    let (info, probe_ok, reason) = ffi::gpu_query();
    GpuInfo {
        build_cuda_major: (info.build_cuda_major > 0).then_some(info.build_cuda_major as u32),
        runtime_version: info.runtime_version,
        driver_version: info.driver_version,
        device_count: info.device_count.max(0) as u32,
        usable: probe_ok && info.usable != 0,
        reason: (!reason.is_empty()).then_some(reason),
    }
}

/// An owned device allocation (`cudaMalloc`), registrable like a
/// [`HostBuffer`](crate::HostBuffer).
///
/// Needs the `cuda12` or `cuda13` feature and a GPU (elsewhere
/// [`new`](Self::new) fails):
///
/// ```no_run
/// use mooncake::gpu::DeviceBuffer;
/// use mooncake::{Access, Engine, LocalMemory};
///
/// # fn main() -> mooncake::Result<()> {
/// let engine = Engine::builder().local_host("127.0.0.1").build()?;
/// let mut dev = DeviceBuffer::new(0, 1 << 20)?; // 1 MiB on GPU 0
/// dev.copy_from_host(0, &[7u8; 4096])?;
/// let gpu = engine.register(dev, "*", Access::RemoteAccessible)?;
/// assert_eq!(gpu.device(), Some(0));
/// assert_eq!(gpu.location()?, "cuda:0");
///
/// // GPU -> host within one engine, through its own segment.
/// let host = engine.register(vec![0u8; 4096], "*", Access::LocalOnly)?;
/// let mut batch = engine.batch(1)?;
/// batch.read(&host, 0, &engine.local_segment(), gpu.addr(), 4096)?;
/// batch.submit()?;
/// batch.wait(None)?;
/// drop(batch);
/// assert_eq!(host.to_vec(), [7u8; 4096]);
/// # Ok(())
/// # }
/// ```
pub struct DeviceBuffer {
    alloc: DeviceAlloc,
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
            return Err(Error::InvalidArgument(
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
///
/// ```no_run
/// use mooncake::gpu::{export_dmabuf, DeviceBuffer};
/// use mooncake::{Access, Engine, LocalMemory};
///
/// # fn main() -> mooncake::Result<()> {
/// let engine = Engine::builder().local_host("127.0.0.1").build()?;
/// let gpu = engine.register(DeviceBuffer::new(0, 1 << 21)?, "*", Access::LocalOnly)?;
/// let dmabuf = export_dmabuf(&gpu, 4096, 4096)?; // the fd covers the whole allocation
/// assert_eq!(dmabuf.device, 0);
/// assert_eq!(dmabuf.base + dmabuf.offset, gpu.addr() + 4096);
/// # Ok(())
/// # }
/// ```
pub fn export_dmabuf<L: LocalMemory + ?Sized>(
    memory: &L,
    offset: usize,
    len: usize,
) -> Result<Dmabuf> {
    let region = crate::memory::region_of(memory);
    if offset.checked_add(len).is_none_or(|e| e > region.len()) {
        return Err(Error::InvalidArgument(format!(
            "range of {len} bytes at offset {offset} exceeds the registered {} bytes",
            region.len()
        )));
    }
    let (fd, out) = ffi::gpu_dmabuf_export(region.ptr().wrapping_add(offset), len)?;
    Ok(Dmabuf {
        fd,
        device: out.device as u32,
        offset: out.offset,
        base: out.base,
        size: out.size,
    })
}

// SAFETY: a cudaMalloc allocation never moves, is valid for `len()` bytes and
// is owned by the DeviceBuffer alone.
unsafe impl RegisterableMemory for DeviceBuffer {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.alloc.ptr()
    }
    fn len(&self) -> usize {
        self.alloc.len()
    }
}

#[cfg(feature = "cudarc")]
// SAFETY: a CudaSlice's device allocation never moves while the slice lives,
// is valid for `num_bytes()` bytes and is owned by the slice.
unsafe impl RegisterableMemory for cudarc::driver::CudaSlice<u8> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        use cudarc::driver::DevicePtrMut;
        let stream = self.stream().clone();
        let (ptr, _record) = self.device_ptr_mut(&stream);
        ptr as usize as *mut u8
    }
    fn len(&self) -> usize {
        self.num_bytes()
    }
    fn prepare_transfer(&self) -> Result<()> {
        // NIC and copy-engine DMA ignore CUDA stream order: finish the work
        // queued on the slice's stream before a transfer reads or fills it.
        self.stream().synchronize().map_err(|e| {
            Error::InvalidArgument(format!("synchronizing the buffer's CUDA stream: {e:?}"))
        })
    }
    fn needs_prepare(&self) -> bool {
        true
    }
}
