//! GPU memory through the safe API. Without a GPU these check the clean
//! failures; the GPU lane runs with MOONCAKE_GPU_TESTS=1 and then fails for
//! real when no GPU is usable.
//!
//! Whether a test applies is known only at run time (is a GPU usable? is the
//! lane on?), so this file has its own `main` (libtest-mimic): a test that
//! does not apply here is reported as *ignored* with the reason, never as
//! passed.
mod common;

use libtest_mimic::{Arguments, Trial};

use mooncake::gpu::{self, DeviceBuffer};
use mooncake::{Access, HostBuffer, LocalMemory};

fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Why a GPU-lane test does not run here, or `None` when it runs. With
/// MOONCAKE_GPU_TESTS=1 an unusable GPU is a failure, not a skip.
fn gpu_lane_off() -> Option<String> {
    if std::env::var("MOONCAKE_GPU_TESTS").as_deref() != Ok("1") {
        return Some("GPU lane off: set MOONCAKE_GPU_TESTS=1 on a machine with a GPU".into());
    }
    let info = gpu::info();
    assert!(
        info.usable,
        "MOONCAKE_GPU_TESTS=1 but the GPU is not usable: {:?}",
        info.reason
    );
    None
}

/// Why the no-GPU checks do not run here (a usable GPU), or `None`.
fn gpu_usable() -> Option<String> {
    gpu::info()
        .usable
        .then(|| "a GPU is usable here; the GPU lane covers it".to_string())
}

/// A test that runs only when `skip` is `None`; otherwise it is listed as
/// ignored, and the reason goes to stderr so the log names it.
fn trial(name: &'static str, skip: Option<String>, f: fn()) -> Trial {
    match skip {
        None => Trial::test(name, move || {
            f();
            Ok(())
        }),
        Some(why) => {
            eprintln!("skipped {name}: {why}");
            Trial::test(name, || Ok(())).with_ignored_flag(true)
        }
    }
}

fn main() {
    let args = Arguments::from_args();
    let lane = gpu_lane_off();
    #[allow(unused_mut)]
    let mut tests = vec![
        trial("build_major_is_published", None, build_major_is_published),
        trial(
            "gpu_calls_fail_cleanly_without_a_gpu",
            gpu_usable(),
            gpu_calls_fail_cleanly_without_a_gpu,
        ),
        trial(
            "device_buffers_over_tcp_and_locally",
            lane.clone(),
            device_buffers_over_tcp_and_locally,
        ),
        trial(
            "dmabuf_export_of_registered_gpu_memory",
            lane.clone(),
            dmabuf_export_of_registered_gpu_memory,
        ),
    ];
    #[cfg(feature = "cudarc")]
    tests.push(trial(
        "cudarc_slices_owned_and_borrowed",
        lane.clone(),
        cudarc_slices_owned_and_borrowed,
    ));
    libtest_mimic::run(&args, tests).exit();
}

const SIZES: [usize; 5] = [4096, 65_549, (1 << 20) + 7, 16 << 20, 64 << 20];

fn build_major_is_published() {
    #[cfg(mooncake_cuda_major = "12")]
    assert_eq!(gpu::CUDA_MAJOR, Some(12));
    #[cfg(mooncake_cuda_major = "13")]
    assert_eq!(gpu::CUDA_MAJOR, Some(13));
    #[cfg(not(mooncake_cuda))]
    assert_eq!(gpu::CUDA_MAJOR, None);
    assert_eq!(gpu::info().build_cuda_major, gpu::CUDA_MAJOR);
}

fn gpu_calls_fail_cleanly_without_a_gpu() {
    let info = gpu::info();
    let reason = info.reason.clone().expect("a reason");
    match gpu::CUDA_MAJOR {
        None => assert!(reason.contains("without CUDA"), "{reason}"),
        Some(m) => assert!(reason.contains(&format!("built for CUDA {m}")), "{reason}"),
    }
    let err = DeviceBuffer::new(0, 4096).unwrap_err();
    assert!(
        err.to_string().contains("GPU memory is not available"),
        "{err}"
    );
    // Host memory still works with CUDA compiled in.
    let e = common::engine();
    let reg = e
        .register(
            HostBuffer::new(4096).unwrap(),
            "*",
            Access::RemoteAccessible,
        )
        .unwrap();
    assert_eq!(reg.device(), None);
}

fn device_buffers_over_tcp_and_locally() {
    let max = 64 << 20;
    let target = common::engine();
    let init = common::engine();
    let mut remote = target
        .register(
            DeviceBuffer::new(0, max).unwrap(),
            "*",
            Access::RemoteAccessible,
        )
        .unwrap();
    let mut local = init
        .register(
            DeviceBuffer::new(0, max).unwrap(),
            "*",
            Access::RemoteAccessible,
        )
        .unwrap();
    assert_eq!(remote.device(), Some(0));
    assert_eq!(remote.location().unwrap(), "cuda:0");
    let seg = init.open_segment(target.segment_name()).unwrap();
    let buf = seg.buffers().unwrap()[0];
    for (i, &sz) in SIZES.iter().enumerate() {
        let data = random(sz, i as u64);
        remote.write_at(0, &data).unwrap();
        local.fill(0x6B).unwrap();
        let mut b = init.batch(1).unwrap();
        b.read(&local, 0, &seg, buf.addr, sz).unwrap();
        b.submit().unwrap();
        b.wait(None).unwrap();
        drop(b);
        let mut got = vec![0u8; sz];
        local.read_at(0, &mut got).unwrap();
        assert!(got == data, "READ of {sz} bytes GPU->GPU over TCP");
        if sz < max {
            let mut one = [0u8];
            local.read_at(sz, &mut one).unwrap();
            assert_eq!(one[0], 0x6B);
        }
        let w = random(sz, 100 + i as u64);
        local.write_at(0, &w).unwrap();
        let mut b = init.batch(1).unwrap();
        b.write(&local, 0, &seg, buf.addr + 8, sz.min(max - 8))
            .unwrap();
        b.submit().unwrap();
        b.wait(None).unwrap();
        drop(b);
        let mut back = vec![0u8; sz.min(max - 8)];
        remote.read_at(8, &mut back).unwrap();
        assert!(
            back[..] == w[..back.len()],
            "WRITE of {sz} bytes GPU->GPU over TCP"
        );
    }
    // Within one engine: GPU -> host registered memory through the local
    // segment (copy engines, no network).
    let host = init
        .register(HostBuffer::new(max).unwrap(), "*", Access::RemoteAccessible)
        .unwrap();
    let me = init.local_segment();
    let w = random(max, 7);
    local.write_at(0, &w).unwrap();
    let mut b = init.batch(1).unwrap();
    b.write(&local, 0, &me, host.addr(), max).unwrap();
    b.submit().unwrap();
    b.wait(None).unwrap();
    drop(b);
    assert!(host.to_vec() == w);
}

fn dmabuf_export_of_registered_gpu_memory() {
    let e = common::engine();
    let reg = e
        .register(
            DeviceBuffer::new(0, 8 << 20).unwrap(),
            "*",
            Access::RemoteAccessible,
        )
        .unwrap();
    let d = gpu::export_dmabuf(&reg, 4096, 1 << 20).unwrap();
    assert_eq!(d.base + d.offset, reg.addr() + 4096);
    assert!(d.size >= 8 << 20);
    use std::os::fd::AsRawFd;
    let link = std::fs::read_link(format!("/proc/self/fd/{}", d.fd.as_raw_fd())).unwrap();
    assert!(link.to_string_lossy().contains("dmabuf"), "{link:?}");
    let host = e
        .register(HostBuffer::new(4096).unwrap(), "*", Access::LocalOnly)
        .unwrap();
    let err = gpu::export_dmabuf(&host, 0, 4096).unwrap_err();
    assert!(err.to_string().contains("not device memory"), "{err}");
}

#[cfg(feature = "cudarc")]
fn cudarc_slices_owned_and_borrowed() {
    use cudarc::driver::CudaContext;
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let target = common::engine();
    let init = common::engine();
    let sink = target
        .register(
            HostBuffer::new(32 << 20).unwrap(),
            "*",
            Access::RemoteAccessible,
        )
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    // Owned: the upload is queued on the slice's stream; submit waits for it.
    let data = random(32 << 20, 11);
    let slice = stream.clone_htod(&data).unwrap();
    let reg = init.register(slice, "*", Access::LocalOnly).unwrap();
    assert_eq!(reg.device(), Some(0));
    let mut b = init.batch(1).unwrap();
    b.write(&reg, 0, &seg, sink.addr(), 32 << 20).unwrap();
    b.submit().unwrap();
    b.wait(None).unwrap();
    drop(b);
    assert!(sink.to_vec() == data);
    let slice = reg.into_inner().unwrap();
    assert_eq!(stream.clone_dtoh(&slice).unwrap(), data);
    // Borrowed: registered for the closure only.
    let mut dst = stream.alloc_zeros::<u8>(1 << 20).unwrap();
    init.with_registered_memory(&mut dst, Access::LocalOnly, |reg| {
        let mut b = init.batch(1).unwrap();
        b.read(reg, 0, &seg, sink.addr() + 4096, 1 << 20).unwrap();
        b.submit().unwrap();
        b.wait(None).unwrap();
    })
    .unwrap();
    assert_eq!(
        stream.clone_dtoh(&dst).unwrap(),
        data[4096..4096 + (1 << 20)].to_vec()
    );
}
