//! Many concurrent transfers from one tokio runtime through the async API:
//! `--transfers N` READs of `--size` bytes (default 10,000 of 4 KiB)
//! between two engines on 127.0.0.1 over TCP, every one its own task and
//! its own `AsyncBatch`, all in flight at once. Every byte is verified; the
//! process's thread count is sampled while they run (`/proc/self/status`).
//! The last line:
//!
//! ```text
//! async_fanout: transfers=N verified=N threads=T p50_us=A p99_us=B
//! ```
//!
//! `threads` is the peak; with the async API it does not grow with the
//! number of transfers: the runtime's workers (`--workers`, default 2), the
//! main thread, one reactor thread, and the two engines' own threads (each
//! sized here for a small box: a handshake listener, a TCP event loop with
//! two workers, and on the initiator two lanes of a sender and a receiver
//! thread).
//!
//! ```text
//! cargo run --release --example async_fanout -- --transfers 10000 [--size 4096] [--workers 2]
//! ```
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake::{Access, Engine, HostBuffer, LocalMemory};

struct Args {
    transfers: usize,
    size: usize,
    workers: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        transfers: 10_000,
        size: 4096,
        workers: 2,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut num = |name: &str| -> Result<usize, String> {
            it.next()
                .ok_or_else(|| format!("{name} needs a value"))?
                .parse::<usize>()
                .map_err(|_| format!("{name}: not a number"))
        };
        match flag.as_str() {
            "--transfers" => a.transfers = num("--transfers")?,
            "--size" => a.size = num("--size")?,
            "--workers" => a.workers = num("--workers")?,
            "-h" | "--help" => {
                return Err(
                    "usage: async_fanout [--transfers N] [--size BYTES] [--workers W]".into(),
                )
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.transfers == 0 || a.size == 0 || a.workers == 0 {
        return Err("--transfers, --size and --workers must be positive".into());
    }
    if a.transfers.checked_mul(a.size).is_none_or(|b| b > 8 << 30) {
        return Err("--transfers × --size must stay within 8 GiB".into());
    }
    Ok(a)
}

/// The process's thread count now, from `/proc/self/status`.
fn threads_now() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

fn byte(i: usize) -> u8 {
    (i.wrapping_mul(31) % 251) as u8
}

fn percentile(sorted: &[Duration], p: f64) -> u128 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_micros()
}

async fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    // Both engines live in this process; each is sized for a small box
    // (its threads are fixed, whatever the number of transfers): two TCP
    // server workers and two lanes (a sender and a receiver thread each).
    let builder = || {
        Engine::builder()
            .local_host("127.0.0.1")
            .same_host_path(false)
            .tcp_server_workers(2)
            .tcp_lanes_per_peer(2)
    };
    let target = builder().build()?;
    let init = builder().build()?;
    let total = args.transfers * args.size;
    let mut src = HostBuffer::new(total)?;
    for (i, b) in src.iter_mut().enumerate() {
        *b = byte(i);
    }
    let published = target.register(src, "*", Access::RemoteAccessible)?;
    let peer = Arc::new(init.open_segment(target.segment_name())?);
    let local = Arc::new(init.register(HostBuffer::new(total)?, "*", Access::LocalOnly)?);
    let base = published.addr();

    // Sampled by a task of the runtime itself: no thread of its own.
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicUsize::new(threads_now()));
    let sampler = {
        let (done, peak) = (done.clone(), peak.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(threads_now(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };

    let size = args.size;
    let tasks: Vec<_> = (0..args.transfers)
        .map(|i| {
            let (init, peer, local) = (init.clone(), peer.clone(), local.clone());
            tokio::spawn(async move {
                let mut batch = init.async_batch(1)?;
                let off = i * size;
                batch.read(&local, off, &peer, base + off as u64, size)?;
                let t0 = Instant::now();
                batch.run().await?;
                Ok::<_, mooncake::Error>(t0.elapsed())
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(tasks.len());
    for t in tasks {
        latencies.push(t.await??);
    }
    done.store(true, Ordering::Relaxed);
    sampler.await?;
    peak.fetch_max(threads_now(), Ordering::Relaxed);

    let local = Arc::try_unwrap(local).map_err(|_| "a batch still holds the memory")?;
    let got = local.to_vec();
    let verified = (0..args.transfers)
        .filter(|&t| {
            let r = t * size..(t + 1) * size;
            got[r.clone()].iter().zip(r).all(|(b, i)| *b == byte(i))
        })
        .count();
    latencies.sort();
    println!(
        "async_fanout: transfers={} verified={} threads={} p50_us={} p99_us={}",
        args.transfers,
        verified,
        peak.load(Ordering::Relaxed),
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99)
    );
    if verified != args.transfers {
        return Err(format!(
            "{} transfers delivered wrong bytes",
            args.transfers - verified
        )
        .into());
    }
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("async_fanout: {e}");
            std::process::exit(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("async_fanout: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run(&args)) {
        eprintln!("async_fanout: {e}");
        std::process::exit(1);
    }
}
