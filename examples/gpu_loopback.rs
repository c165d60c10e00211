//! GPU memory end to end on one machine: two engines on 127.0.0.1, each
//! with a registered device buffer, READ and WRITE between them over TCP
//! (staged through pinned host buffers; CUDA IPC is for engines in different
//! processes, see `scripts/gpu-lane.sh`), and a copy from GPU to registered
//! host memory inside one engine by the copy engines. Every byte is checked
//! after the destination was poisoned.
//!
//! ```text
//! cargo run --release --features cuda12 --example gpu_loopback   # or cuda13
//! ```
//!
//! Without a usable GPU (or in a CPU-only build) it says why and exits 2.
use mooncake::gpu::{self, DeviceBuffer};
use mooncake::{Access, Engine, HostBuffer, LocalMemory, Registration, RemoteSegment};
use mooncake_connector::testkit::{check_pattern, fill_pattern};

const MIB: usize = 1 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();

    let info = gpu::info();
    println!(
        "build CUDA major {:?}, runtime {}, driver {}, {} GPU(s)",
        info.build_cuda_major, info.runtime_version, info.driver_version, info.device_count
    );
    if !info.usable {
        eprintln!(
            "gpu_loopback: no usable GPU: {}",
            info.reason.as_deref().unwrap_or("unknown reason")
        );
        std::process::exit(2);
    }

    let target = Engine::builder().local_host("127.0.0.1").build()?;
    let initiator = Engine::builder().local_host("127.0.0.1").build()?;
    let size = 64 * MIB;
    let mut published =
        target.register(DeviceBuffer::new(0, size)?, "*", Access::RemoteAccessible)?;
    let mut local = initiator.register(DeviceBuffer::new(0, size)?, "*", Access::LocalOnly)?;
    let segment = initiator.open_segment(target.segment_name())?;
    let remote = segment.buffers()?[0];
    println!(
        "target {} publishes GPU memory {:#x} ({} bytes) on GPU {:?}\n",
        target.segment_name(),
        remote.addr,
        remote.len,
        published.device()
    );

    println!("{:<7} {:>10}  result", "op", "bytes");
    gpu_round_trips(
        &initiator,
        &mut local,
        &mut published,
        &segment,
        remote.addr,
    )?;

    // Within one engine: device -> registered host memory by the copy engines.
    let sink = initiator.register(HostBuffer::new(size)?, "*", Access::RemoteAccessible)?;
    let me = initiator.local_segment();
    let mut batch = initiator.batch(1)?;
    batch.write(&local, 0, &me, sink.addr(), size)?;
    batch.submit()?;
    batch.wait(None)?;
    drop(batch);
    if let Some(i) = check_pattern(&sink.to_vec(), 2, 0) {
        return Err(format!("local GPU->host copy: wrong byte at {i}").into());
    }
    println!(
        "{:<7} {size:>10}  every byte verified (GPU -> host, one engine)",
        "LOCAL"
    );
    println!("\ncounters: {:?}", initiator.counters()?);
    Ok(())
}

/// A READ and a WRITE of each size between the two device buffers, each
/// checked byte by byte after the destination was poisoned.
fn gpu_round_trips(
    initiator: &Engine,
    local: &mut Registration<DeviceBuffer>,
    published: &mut Registration<DeviceBuffer>,
    segment: &RemoteSegment,
    remote_addr: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut host = vec![0u8; 64 * MIB];
    for &len in &[1usize, 4096, MIB + 3, 16 * MIB, 64 * MIB] {
        fill_pattern(&mut host[..len], 1, 0);
        published.write_at(0, &host[..len])?;
        local.fill(0xEE)?;
        let mut batch = initiator.batch(1)?;
        batch.read(&*local, 0, segment, remote_addr, len)?;
        batch.submit()?;
        batch.wait(None)?;
        drop(batch);
        local.read_at(0, &mut host[..len])?;
        if let Some(i) = check_pattern(&host[..len], 1, 0) {
            return Err(format!("GPU READ of {len} bytes: wrong byte at {i}").into());
        }
        println!("{:<7} {len:>10}  every byte verified", "READ");

        fill_pattern(&mut host[..len], 2, 0);
        local.write_at(0, &host[..len])?;
        published.fill(0xEE)?;
        let mut batch = initiator.batch(1)?;
        batch.write(&*local, 0, segment, remote_addr, len)?;
        batch.submit()?;
        batch.wait(None)?;
        drop(batch);
        published.read_at(0, &mut host[..len])?;
        if let Some(i) = check_pattern(&host[..len], 2, 0) {
            return Err(format!("GPU WRITE of {len} bytes: wrong byte at {i}").into());
        }
        println!("{:<7} {len:>10}  every byte verified", "WRITE");
    }
    Ok(())
}
