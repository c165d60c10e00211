//! `--gpu`: the same layouts, prompt sizes and patterns with both KV caches
//! in GPU memory (GPU 0 of each process).
//!
//! The connector registers host memory, so this mode drives the engine
//! directly with what the connector plans: the prefill child (one engine
//! per TP rank) WRITEs its blocks into the decode cache of this process,
//! one batch per rank and request, the ranks concurrently, as the producer
//! does. A rank sends its block lists ([`plan_block_lists`], one
//! `Batch::submit_blocks` per KV-cache group) when they are fewer engine
//! calls than its descriptors ([`plan_descriptors`], one request per merged
//! run): scattered blocks go as lists, contiguous ones as one request per
//! region. `--per-request` always sends descriptors. The time
//! is the median, over `--runs`, of the child's wall time from the first
//! queued descriptor to the last rank's completed batch (no ZMQ round trip,
//! unlike the host mode). Paths: `gpu-tcp` (CUDA IPC off on both engines:
//! TCP with pinned staging) and `gpu-ipc` (the engine's same-host path for
//! GPU memory, CUDA IPC; `--path same-host` selects it; `gpu-same-host` is
//! accepted as another name for it, since `process_vm_*` cannot reach device
//! memory). Sampled blocks are checked as in the host mode, and the child's
//! engine counters must show the path asked for.
use std::io::{BufRead, Write};
use std::time::Instant;

use mooncake::gpu::{self, DeviceBuffer};
use mooncake::{Access, BlockRegion, Engine, Opcode, Registration, RemoteSegment};
use mooncake_connector::connector::regions::{BlockList, Descriptor};
use mooncake_connector::sim::kv_layouts::{
    all_layouts, plan_block_lists, plan_descriptors, BenchLayout,
};

use crate::host::{case_blocks, pattern_name, sample_indices, sampled_blocks, DecodeCache, Sizes};
use crate::prefill::PrefillProc;
use crate::report::{gib, print_header, Row};
use crate::{fail, BenchPath, Opts};

impl BenchPath {
    fn gpu_name(self) -> &'static str {
        match self {
            Self::Tcp => "gpu-tcp",
            Self::SameHost => "gpu-ipc",
        }
    }
}

fn engine(path: BenchPath) -> Engine {
    Engine::builder()
        .local_host("127.0.0.1")
        .cuda_ipc(path == BenchPath::SameHost)
        .build()
        .unwrap_or_else(|e| fail(format!("engine: {e}")))
}

/// The decode cache in GPU memory: regions of `d_blocks` blocks, one after
/// another.
struct GpuCache<'a> {
    kv: &'a mut Registration<DeviceBuffer>,
    region_bytes: u64,
    block_bytes: u64,
}

impl DecodeCache for GpuCache<'_> {
    fn offset(&self, region: usize, block: u64) -> usize {
        (region as u64 * self.region_bytes + block * self.block_bytes) as usize
    }
    fn write(&mut self, off: usize, data: &[u8]) -> Result<(), String> {
        self.kv.write_at(off, data).map_err(|e| e.to_string())
    }
    fn read(&self, off: usize, out: &mut [u8]) -> Result<(), String> {
        self.kv.read_at(off, out).map_err(|e| e.to_string())
    }
}

/// The parent (decode) side of `--gpu`.
pub(crate) fn run(opts: &Opts) {
    let info = gpu::info();
    if !info.usable {
        eprintln!(
            "kv_bench --gpu: no usable GPU: {}",
            info.reason.as_deref().unwrap_or("unknown reason")
        );
        std::process::exit(2);
    }
    if !opts.json {
        println!(
            "mooncake-rs KV transfer, GPU memory on both sides: prefill (child process, one engine \
             per TP rank) WRITEs into decode, 127.0.0.1, median of {} runs",
            opts.runs
        );
    }
    for layout in &opts.layouts {
        let tp = layout.prefill_tp;
        let sizes = Sizes::new(layout, opts);
        if !opts.json {
            println!(
                "\nlayout {}: {}\n  GPU caches: prefill {:.2} GiB per rank (TP {tp}), decode {:.2} GiB",
                layout.name,
                layout.description,
                gib(sizes.src_bytes),
                gib(sizes.dst_bytes)
            );
            print_header("ipc copies");
        }
        for &path in &opts.paths {
            run_path(opts, layout, &sizes, path);
        }
    }
}

/// One layout over one path: the decode cache on this process's GPU, the
/// prefill child, then every case.
fn run_path(opts: &Opts, layout: &BenchLayout, sizes: &Sizes, path: BenchPath) {
    let dst_bytes = sizes.dst_bytes;
    let decode = engine(path);
    let buf = DeviceBuffer::new(0, dst_bytes as usize)
        .unwrap_or_else(|e| fail(format!("decode GPU cache of {dst_bytes} bytes: {e}")));
    let mut kv = decode
        .register(buf, "*", Access::RemoteAccessible)
        .unwrap_or_else(|e| fail(format!("registering the decode cache: {e}")));
    let mut cache = GpuCache {
        kv: &mut kv,
        region_bytes: sizes.d_blocks * layout.block_bytes,
        block_bytes: layout.block_bytes,
    };
    let mut child = PrefillProc::spawn_with(
        &[
            "--gpu-prefill-child",
            layout.name,
            &sizes.p_blocks.to_string(),
            &sizes.d_blocks.to_string(),
            decode.segment_name(),
            path.gpu_name(),
            if opts.per_request {
                "per-request"
            } else {
                "lists"
            },
        ],
        None,
    );
    child.expect("READY");
    for &n in &opts.tokens {
        for &scattered in &opts.scattered {
            run_case(opts, layout, path, &mut cache, &mut child, n, scattered);
        }
    }
    drop(child);
}

/// One case (prompt size and pattern): `--runs` pushes by the child,
/// checks of the path taken and of the bytes, its row.
fn run_case(
    opts: &Opts,
    layout: &BenchLayout,
    path: BenchPath,
    cache: &mut GpuCache<'_>,
    child: &mut PrefillProc,
    n: usize,
    scattered: bool,
) {
    let pattern = pattern_name(scattered);
    let (src, dst) = case_blocks(layout, n, scattered);
    let samples = sample_indices(src.len(), opts.verify_all);
    sampled_blocks(layout, cache, &src, &dst, &samples, false).unwrap_or_else(|e| fail(e));
    let mut times = Vec::with_capacity(opts.runs);
    let (mut descs, mut bytes, mut tcp, mut ipc) = (0u64, 0u64, 0u64, 0u64);
    for _ in 0..opts.runs {
        child.send(&format!("PUSH {n} {}", u8::from(scattered)));
        let done = child.expect("DONE");
        let num = |i: usize| -> u64 {
            done.get(i)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| fail(format!("bad DONE line {done:?}")))
        };
        (descs, bytes) = (num(1), num(2));
        times.push(num(3));
        tcp += num(4);
        ipc += num(5);
    }
    let wrong = match path {
        BenchPath::SameHost => ipc == 0 || tcp != 0,
        BenchPath::Tcp => tcp == 0 || ipc != 0,
    };
    if wrong {
        fail(format!(
            "{} {n} {pattern}: {} was requested but {tcp} TCP requests and {ipc} IPC copies were made",
            layout.name,
            path.gpu_name()
        ));
    }
    sampled_blocks(layout, cache, &src, &dst, &samples, true).unwrap_or_else(|e| {
        fail(format!(
            "{} {n} {pattern} {}: wrong KV bytes: {e}",
            layout.name,
            path.gpu_name()
        ))
    });
    times.sort_unstable();
    let ms = times[times.len() / 2] as f64 / 1e3;
    let runs = opts.runs as u64;
    Row::new(layout.name, n, pattern, path.gpu_name(), descs, bytes, ms).print(
        opts.json,
        tcp / runs,
        ipc / runs,
    );
}

/// The prefill side of `--gpu`: `--gpu-prefill-child <layout> <prefill
/// blocks> <decode blocks> <decode segment> <path> <lists|per-request>`.
/// Fills one GPU cache per TP rank, answers `READY`, then serves `PUSH
/// <tokens> <scattered 0|1>` lines with `DONE <descriptors> <bytes>
/// <microseconds> <tcp requests> <ipc copies>`. Exits at end of input.
pub(crate) fn prefill_child(args: &[String]) {
    let [name, p_blocks, d_blocks, segment, path, mode] = args else {
        fail("--gpu-prefill-child needs <layout> <prefill blocks> <decode blocks> <segment> <path> <mode>")
    };
    let lists_allowed = mode == "lists";
    let layout = all_layouts()
        .into_iter()
        .find(|l| l.name == name.as_str())
        .unwrap_or_else(|| fail(format!("unknown layout {name:?}")));
    let parse = |v: &str| -> u64 {
        v.parse()
            .unwrap_or_else(|_| fail(format!("bad number {v:?}")))
    };
    let (p_blocks, d_blocks) = (parse(p_blocks), parse(d_blocks));
    let path = if path.as_str() == "gpu-ipc" {
        BenchPath::SameHost
    } else {
        BenchPath::Tcp
    };
    let ranks = prefill_ranks(&layout, p_blocks, path, segment);
    // The decode cache: the one buffer the decode engine publishes.
    let base = ranks[0]
        .2
        .buffers()
        .ok()
        .and_then(|b| b.first().map(|r| r.addr))
        .unwrap_or_else(|| fail("the decode engine publishes no buffer"));
    println!("READY");
    let _ = std::io::stdout().flush();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let f: Vec<&str> = line.split(' ').collect();
        let ["PUSH", tokens, scattered] = f.as_slice() else {
            fail(format!("gpu prefill child: unexpected command {line:?}"))
        };
        let (src, dst) = case_blocks(&layout, parse(tokens) as usize, *scattered == "1");
        let plan = plan_descriptors(&layout, p_blocks, d_blocks, &src, &dst)
            .unwrap_or_else(|e| fail(format!("planning: {e}")));
        let lists = plan_block_lists(&layout, p_blocks, d_blocks, &src, &dst)
            .unwrap_or_else(|e| fail(format!("planning: {e}")));
        // Lists when they are fewer engine calls' worth of regions than the
        // descriptors (one per merged run) are requests.
        let use_lists = lists_allowed
            && plan
                .iter()
                .zip(&lists)
                .all(|(d, l)| l.iter().map(|x| x.regions.len()).sum::<usize>() < d.len());
        let before: Vec<_> = ranks
            .iter()
            .map(|(e, _, _)| e.counters().unwrap_or_else(|e| fail(e)))
            .collect();
        let t0 = Instant::now();
        if use_lists {
            push_lists(&ranks, &lists, base);
        } else {
            push(&ranks, &plan, base);
        }
        let micros = t0.elapsed().as_micros();
        let (mut tcp, mut ipc) = (0, 0);
        for ((e, _, _), b) in ranks.iter().zip(&before) {
            let c = e.counters().unwrap_or_else(|e| fail(e));
            tcp += c.tcp_requests_sent - b.tcp_requests_sent;
            ipc += c.ipc_copies - b.ipc_copies;
        }
        let descs: usize = plan.iter().map(Vec::len).sum();
        let bytes: u64 = plan.iter().flatten().map(|d| d.len).sum();
        println!("DONE {descs} {bytes} {micros} {tcp} {ipc}");
        let _ = std::io::stdout().flush();
    }
}

/// One engine per TP rank of `layout`, each with its GPU cache of
/// `p_blocks` blocks per region filled with the layout's pattern, and the
/// decode engine's segment `segment` opened.
fn prefill_ranks(
    layout: &BenchLayout,
    p_blocks: u64,
    path: BenchPath,
    segment: &str,
) -> Vec<(Engine, Registration<DeviceBuffer>, RemoteSegment)> {
    let tp = layout.prefill_tp;
    let rank_block = layout.rank_block_bytes(tp) as usize;
    let region_bytes = p_blocks as usize * rank_block;
    let mut ranks = Vec::with_capacity(tp);
    for rank in 0..tp {
        let e = engine(path);
        let mut buf = DeviceBuffer::new(0, layout.regions() * region_bytes)
            .unwrap_or_else(|e| fail(format!("prefill GPU cache: {e}")));
        let mut host = vec![0u8; region_bytes];
        for region in 0..layout.regions() {
            for (b, block) in host.chunks_mut(rank_block).enumerate() {
                layout.fill_block(tp, rank, region, b as u64, block);
            }
            buf.copy_from_host(region * region_bytes, &host)
                .unwrap_or_else(|e| fail(format!("filling the prefill cache: {e}")));
        }
        let kv = e
            .register(buf, "*", Access::LocalOnly)
            .unwrap_or_else(|e| fail(format!("registering the prefill cache: {e}")));
        let seg = e
            .open_segment(segment)
            .unwrap_or_else(|e| fail(format!("opening {segment}: {e}")));
        ranks.push((e, kv, seg));
    }
    ranks
}

/// WRITEs each rank's descriptors in `plan` into the decode cache at
/// `base`, one batch per rank, the ranks concurrently; returns once every
/// batch completed.
fn push(
    ranks: &[(Engine, Registration<DeviceBuffer>, RemoteSegment)],
    plan: &[Vec<Descriptor>],
    base: u64,
) {
    std::thread::scope(|s| {
        for ((e, kv, seg), descs) in ranks.iter().zip(plan) {
            s.spawn(move || {
                let mut batch = e.batch(descs.len().max(1)).unwrap_or_else(|e| fail(e));
                for d in descs {
                    batch
                        .write(kv, d.src as usize, seg, base + d.dst, d.len as usize)
                        .unwrap_or_else(|e| fail(format!("queueing a descriptor: {e}")));
                }
                batch.submit().unwrap_or_else(|e| fail(e));
                if let Err(e) = batch.wait(None) {
                    fail(format!("GPU KV batch failed: {e}"));
                }
            });
        }
    });
}

/// Like [`push`], with each rank's block lists: one `submit_blocks` per
/// list (KV-cache group), one batch per rank, the ranks concurrently.
fn push_lists(
    ranks: &[(Engine, Registration<DeviceBuffer>, RemoteSegment)],
    lists: &[Vec<BlockList>],
    base: u64,
) {
    std::thread::scope(|s| {
        for ((e, kv, seg), lists) in ranks.iter().zip(lists) {
            s.spawn(move || {
                let mut batch = e.batch(lists.len().max(1)).unwrap_or_else(|e| fail(e));
                for l in lists {
                    let regions: Vec<BlockRegion> = l
                        .regions
                        .iter()
                        .map(|r| BlockRegion {
                            local_offset: r.src,
                            remote_addr: base + r.dst,
                            local_stride: r.src_stride,
                            remote_stride: r.dst_stride,
                            block_len: r.len,
                        })
                        .collect();
                    batch
                        .submit_blocks(Opcode::Write, kv, seg, &regions, &l.src_ids, &l.dst_ids)
                        .unwrap_or_else(|e| fail(format!("submitting a block list: {e}")));
                }
                if let Err(e) = batch.wait(None) {
                    fail(format!("GPU KV block list failed: {e}"));
                }
            });
        }
    });
}
