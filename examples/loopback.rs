//! Moves data between two engines over TCP on 127.0.0.1 and verifies every
//! byte: READs and WRITEs from 1 byte to 64 MiB, a 1024-request batch, and a
//! notification. Prints what it checked.
//!
//! ```text
//! cargo run --release --example loopback
//! ```
use mooncake::{Access, Engine, HostBuffer, LocalMemory, Registration, RemoteSegment};
use mooncake_connector::testkit::{check_pattern, fill_pattern};

const MIB: usize = 1 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();

    let target = Engine::builder().local_host("127.0.0.1").build()?;
    let initiator = Engine::builder().local_host("127.0.0.1").build()?;
    println!("mooncake-rs engine {}", Engine::version());
    println!("target segment    {}", target.segment_name());
    println!("initiator segment {}", initiator.segment_name());

    let size = 64 * MIB;
    let mut mem = HostBuffer::new(size)?;
    fill_pattern(&mut mem, 1, 0);
    let mut published = target.register(mem, "*", Access::RemoteAccessible)?;
    let mut local = initiator.register(HostBuffer::new(size)?, "*", Access::LocalOnly)?;
    let segment = initiator.open_segment(target.segment_name())?;
    let remote = segment.buffers()?[0];
    println!(
        "remote buffer     {:#x}, {} bytes\n",
        remote.addr, remote.len
    );

    println!("{:<7} {:>10} {:>9}  result", "op", "bytes", "requests");
    let mut checked = single_transfers(
        &initiator,
        &mut local,
        &mut published,
        &segment,
        remote.addr,
    )?;
    checked += scattered_batch(&initiator, &mut local, &segment, remote.addr)?;

    let notes = target.notifications()?;
    let got = notes
        .iter()
        .any(|n| n.name == "loopback-example" && n.message == "batch-done");
    println!(
        "\nnotification after the batch: {}",
        if got { "received" } else { "MISSING" }
    );
    if !got {
        return Err("the batch's notification did not arrive".into());
    }
    println!(
        "verified {checked} bytes byte by byte between {} and {}",
        initiator.segment_name(),
        target.segment_name()
    );
    println!(
        "local buffer {:#x} ({} bytes), all transfers zero-copy from/to registered memory",
        local.addr(),
        local.len()
    );
    Ok(())
}

fn report(op: &str, bytes: usize, requests: usize) {
    println!("{op:<7} {bytes:>10} {requests:>9}  every byte verified");
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

/// One READ and one WRITE per size from 1 byte to 64 MiB at the start of
/// the target's buffer (`remote_addr`), each checked byte by byte; the
/// bytes checked.
fn single_transfers(
    initiator: &Engine,
    local: &mut Registration<HostBuffer>,
    published: &mut Registration<HostBuffer>,
    segment: &RemoteSegment,
    remote_addr: u64,
) -> AnyResult<usize> {
    let mut checked = 0usize;
    for &len in &[1usize, 4096, 65_536, MIB + 3, 16 * MIB, 64 * MIB] {
        // READ: poison the destination, transfer, compare with the pattern.
        local.fill(0xEE)?;
        let mut batch = initiator.batch(1)?;
        batch.read(&*local, 0, segment, remote_addr, len)?;
        batch.submit()?;
        batch.wait(None)?;
        drop(batch);
        let bytes = local.local_slice_mut(None)?;
        if let Some(i) = check_pattern(&bytes[..len], 1, 0) {
            return Err(format!("READ of {len} bytes: wrong byte at {i}").into());
        }
        report("READ", len, 1);
        checked += len;

        // WRITE: a second pattern from the initiator into the target.
        fill_pattern(&mut bytes[..len], 2, 0);
        let mut batch = initiator.batch(1)?;
        batch.write(&*local, 0, segment, remote_addr, len)?;
        batch.submit()?;
        batch.wait(None)?;
        drop(batch);
        let mut back = vec![0u8; len];
        published.read_at(0, &mut back)?;
        if let Some(i) = check_pattern(&back, 2, 0) {
            return Err(format!("WRITE of {len} bytes: wrong byte at {i}").into());
        }
        report("WRITE", len, 1);
        checked += len;
        let mut restore = vec![0u8; len];
        fill_pattern(&mut restore, 1, 0);
        published.write_at(0, &restore)?;
    }
    Ok(checked)
}

/// One batch of scattered READs with a notification, checked; the bytes
/// checked.
fn scattered_batch(
    initiator: &Engine,
    local: &mut Registration<HostBuffer>,
    segment: &RemoteSegment,
    remote_addr: u64,
) -> AnyResult<usize> {
    // One batch of 1024 scattered 16 KiB READs (block order reversed).
    let (n, block) = (1024usize, 16 * 1024usize);
    local.fill(0)?;
    let mut batch = initiator.batch(n)?;
    for i in 0..n {
        batch.read(
            &*local,
            i * block,
            segment,
            remote_addr + ((n - 1 - i) * block) as u64,
            block,
        )?;
    }
    batch.submit_with_notify("loopback-example", "batch-done")?;
    batch.wait(None)?;
    drop(batch);
    let bytes = local.local_slice_mut(None)?;
    for i in 0..n {
        if let Some(j) = check_pattern(&bytes[i * block..(i + 1) * block], 1, (n - 1 - i) * block) {
            return Err(format!("batch request {i}: wrong byte at {j}").into());
        }
    }
    report("READ", n * block, n);
    Ok(n * block)
}
