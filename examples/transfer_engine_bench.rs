//! Our engine's counterpart of upstream Mooncake's `transfer_engine_bench`:
//! the same flags, the same access pattern and the same result line, so the
//! two can run side by side and against each other (our initiator against
//! an upstream target and the reverse).
//!
//! ```text
//! # target: registers --buffer_size bytes and serves them until killed
//! transfer_engine_bench --mode=target --protocol=tcp --metadata_server=P2PHANDSHAKE \
//!     --local_server_name=127.0.0.1
//! # initiator: --threads threads, each submitting batches of --batch_size
//! # requests of --block_size bytes and waiting for them, for --duration s
//! transfer_engine_bench --mode=initiator --protocol=tcp --metadata_server=P2PHANDSHAKE \
//!     --segment_id=127.0.0.1:<target rpc port> --operation=read \
//!     --threads=2 --batch_size=32 --block_size=65536 --duration=5
//! ```
//!
//! As upstream, thread `t` uses block `i * threads + t` of its buffer for
//! request `i` of every batch, on both sides, and the result is
//! `Test completed: duration D, batch count N, throughput X GB/s`
//! (bytes = N × batch_size × block_size). `--metadata_server` takes
//! upstream's connection strings (`P2PHANDSHAKE`, `etcd://`, `redis://`,
//! `http://`); with a store, `--local_server_name` is the segment name and
//! `--segment_id` the target's. Flags of ours beyond upstream's:
//! `--same_host=auto|off` (the same-host path, default auto),
//! `--lanes=N` (TCP connections per peer), and `--reuse_batches=1|0` (one
//! batch per thread, reset between rounds, instead of upstream's
//! allocate/free per round; default 1). The result line also gives the
//! request rate and which path the requests took.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake::{Access, Engine, HostBuffer, Metadata, Registration, RemoteSegment};

struct Flags {
    mode: String,
    protocol: String,
    metadata_server: String,
    metadata: Metadata,
    local_server_name: String,
    segment_id: String,
    operation: String,
    buffer_size: usize,
    batch_size: usize,
    block_size: usize,
    duration: u64,
    threads: usize,
    report_unit: String,
    report_precision: usize,
    same_host: bool,
    lanes: Option<u32>,
    reuse_batches: bool,
}

fn parse_flags() -> Result<Flags, String> {
    let mut f = Flags {
        mode: "initiator".into(),
        protocol: "rdma".into(),
        metadata_server: "192.168.3.77:2379".into(),
        metadata: Metadata::P2pHandshake,
        local_server_name: "127.0.0.1".into(),
        segment_id: "192.168.3.76".into(),
        operation: "read".into(),
        buffer_size: 1 << 30,
        batch_size: 128,
        block_size: 65536,
        duration: 10,
        threads: 12,
        report_unit: "GB".into(),
        report_precision: 2,
        same_host: true,
        lanes: None,
        reuse_batches: true,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        // gflags style: -flag, --flag, with =value or a separate value.
        let raw = args[i].trim_start_matches('-');
        let (name, value) = match raw.split_once('=') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None => {
                i += 1;
                let v = args
                    .get(i)
                    .cloned()
                    .ok_or_else(|| format!("--{raw} needs a value"))?;
                (raw.to_string(), v)
            }
        };
        i += 1;
        let num = |v: &str| -> Result<usize, String> {
            v.parse::<usize>()
                .map_err(|_| format!("--{name}: not a number: {v}"))
        };
        match name.as_str() {
            "mode" => f.mode = value,
            "protocol" => f.protocol = value,
            "metadata_server" => f.metadata_server = value,
            "local_server_name" => f.local_server_name = value,
            "segment_id" => f.segment_id = value,
            "operation" => f.operation = value,
            "buffer_size" => f.buffer_size = num(&value)?,
            "batch_size" => f.batch_size = num(&value)?,
            "block_size" => f.block_size = num(&value)?,
            "duration" => f.duration = num(&value)? as u64,
            "threads" => f.threads = num(&value)?,
            "report_unit" => f.report_unit = value,
            "report_precision" => f.report_precision = num(&value)?,
            "same_host" => f.same_host = value != "off" && value != "0" && value != "false",
            "lanes" => f.lanes = Some(num(&value)? as u32),
            "reuse_batches" => f.reuse_batches = value != "0" && value != "false",
            // Upstream flags that do not apply here.
            "device_name" | "nic_priority_matrix" | "auto_discovery" | "backend" => {}
            other => return Err(format!("unknown flag --{other}")),
        }
    }
    f.metadata = f
        .metadata_server
        .parse()
        .map_err(|e| format!("--metadata_server: {e}"))?;
    if f.protocol != "tcp" {
        return Err(format!(
            "--protocol={} is not supported; use --protocol=tcp",
            f.protocol
        ));
    }
    if f.batch_size == 0 || f.block_size == 0 || f.threads == 0 {
        return Err("--batch_size, --block_size and --threads must be positive".into());
    }
    Ok(f)
}

fn unit(name: &str) -> (f64, &str) {
    match name {
        "GiB" => ((1u64 << 30) as f64, "GiB"),
        "Gb" => (1e9 / 8.0, "Gb"),
        "MB" => (1e6, "MB"),
        "MiB" => ((1u64 << 20) as f64, "MiB"),
        "Mb" => (1e6 / 8.0, "Mb"),
        "KB" => (1e3, "KB"),
        "KiB" => (1024.0, "KiB"),
        "Kb" => (1e3 / 8.0, "Kb"),
        _ => (1e9, "GB"),
    }
}

fn builder(f: &Flags) -> Result<mooncake::EngineBuilder, String> {
    let (host, port) = match f.local_server_name.rsplit_once(':') {
        Some((h, p)) => (
            h.to_string(),
            Some(
                p.parse::<u16>()
                    .map_err(|_| format!("--local_server_name: bad port {p:?}"))?,
            ),
        ),
        None => (f.local_server_name.clone(), None),
    };
    let mut b = Engine::builder()
        .local_host(host)
        .same_host_path(f.same_host);
    if f.metadata.is_centralised() {
        // As upstream: with a store, --local_server_name is the segment
        // name, and a port in it is the handshake port.
        b = b
            .metadata(f.metadata.clone())
            .segment_name(f.local_server_name.clone());
        if let Some(p) = port {
            b = b.rpc_port(p);
        }
    }
    if let Some(n) = f.lanes {
        b = b.tcp_lanes_per_peer(n);
    }
    Ok(b)
}

fn target(f: &Flags) -> Result<(), Box<dyn std::error::Error>> {
    let engine = builder(f)?.build()?;
    let buf = engine.register(
        HostBuffer::new(f.buffer_size)?,
        "cpu:0",
        Access::RemoteAccessible,
    )?;
    if f.metadata.is_centralised() {
        println!(
            "Transfer Engine RPC published in {} as {}",
            f.metadata.conn_string(),
            engine.segment_name()
        );
    } else {
        println!(
            "Transfer Engine RPC using P2P handshake, listening on {}",
            engine.segment_name()
        );
    }
    println!("target segment {}", engine.segment_name());
    // Serve until killed (SIGINT/SIGTERM end the process).
    loop {
        std::thread::sleep(Duration::from_secs(3600));
        let _ = &buf;
    }
}

/// How the initiator's threads share the buffer: thread `t` moves block
/// `i * threads + t` for request `i` of each batch.
#[derive(Clone, Copy)]
struct Stripe {
    threads: usize,
    batch_size: usize,
    block: usize,
    reuse: bool,
    write: bool,
}

/// One initiator thread: batches of `stripe.batch_size` requests, submitted
/// and waited for one after the other until `running` turns false; the
/// number of batches it completed.
fn worker(
    engine: &Engine,
    local: &Registration<HostBuffer>,
    segment: &RemoteSegment,
    remote_addr: u64,
    t: usize,
    stripe: Stripe,
    running: &AtomicBool,
) -> mooncake::Result<u64> {
    let mut count = 0u64;
    let mut reused = if stripe.reuse {
        Some(engine.batch(stripe.batch_size)?)
    } else {
        None
    };
    while running.load(Ordering::Relaxed) {
        let mut fresh;
        let batch = match reused.as_mut() {
            Some(b) => {
                b.reset()?;
                b
            }
            None => {
                fresh = engine.batch(stripe.batch_size)?;
                &mut fresh
            }
        };
        for i in 0..stripe.batch_size {
            let off = stripe.block * (i * stripe.threads + t);
            let raddr = remote_addr + off as u64;
            if stripe.write {
                batch.write(local, off, segment, raddr, stripe.block)?;
            } else {
                batch.read(local, off, segment, raddr, stripe.block)?;
            }
        }
        batch.submit()?;
        batch.wait(None)?;
        count += 1;
    }
    Ok(count)
}

fn initiator(f: &Flags) -> Result<(), Box<dyn std::error::Error>> {
    let span = f.block_size * f.batch_size * f.threads;
    if span > f.buffer_size {
        return Err(format!(
            "--block_size × --batch_size × --threads = {span} exceeds --buffer_size {}",
            f.buffer_size
        )
        .into());
    }
    let write = match f.operation.as_str() {
        "read" => false,
        "write" => true,
        other => return Err(format!("--operation={other}: use read or write").into()),
    };
    let engine = builder(f)?.build()?;
    let local: Arc<Registration<HostBuffer>> = Arc::new(engine.register(
        HostBuffer::new(f.buffer_size)?,
        "cpu:0",
        Access::RemoteAccessible,
    )?);
    let segment = Arc::new(engine.open_segment(&f.segment_id)?);
    let remote = segment
        .buffers()?
        .first()
        .copied()
        .ok_or("the target publishes no buffer")?;
    if (remote.len as usize) < span {
        return Err(format!(
            "the target's buffer ({} bytes) is smaller than block × batch × threads = {span}",
            remote.len
        )
        .into());
    }
    let running = Arc::new(AtomicBool::new(true));
    let batches = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut workers = Vec::new();
    let stripe = Stripe {
        threads: f.threads,
        batch_size: f.batch_size,
        block: f.block_size,
        reuse: f.reuse_batches,
        write,
    };
    for t in 0..f.threads {
        let (engine, local, segment) = (engine.clone(), local.clone(), segment.clone());
        let (running, batches) = (running.clone(), batches.clone());
        workers.push(std::thread::spawn(move || -> mooncake::Result<()> {
            let count = worker(&engine, &local, &segment, remote.addr, t, stripe, &running)?;
            batches.fetch_add(count, Ordering::Relaxed);
            Ok(())
        }));
    }
    std::thread::sleep(Duration::from_secs(f.duration));
    running.store(false, Ordering::Relaxed);
    for w in workers {
        w.join().map_err(|_| "a worker panicked")??;
    }
    let secs = start.elapsed().as_secs_f64();
    let n = batches.load(Ordering::Relaxed);
    let bytes = n as f64 * f.batch_size as f64 * f.block_size as f64;
    let (div, name) = unit(&f.report_unit);
    let c = engine.counters()?;
    println!(
        "Test completed: duration {secs:.2}, batch count {n}, throughput {:.*} {name}/s",
        f.report_precision,
        bytes / secs / div
    );
    println!(
        "requests {:.0}/s; paths: tcp {} same-host {}",
        n as f64 * f.batch_size as f64 / secs,
        c.tcp_requests_sent,
        c.same_host_requests
    );
    Ok(())
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let flags = match parse_flags() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("transfer_engine_bench: {e}");
            std::process::exit(2);
        }
    };
    let r = match flags.mode.as_str() {
        "target" => target(&flags),
        "initiator" => initiator(&flags),
        other => Err(format!("--mode={other}: use target or initiator").into()),
    };
    if let Err(e) = r {
        eprintln!("transfer_engine_bench: {e}");
        std::process::exit(1);
    }
}
