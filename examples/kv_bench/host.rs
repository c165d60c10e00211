//! The host-memory mode: per layout and path a decode connector in this
//! process and a prefill child, then every case (prompt size and pattern)
//! pulled `--runs` times, its path and sampled bytes checked. The cache
//! sizing, block choice and sampled checks are shared with `gpu.rs`.
use std::time::{Duration, Instant};

use mooncake::LocalMemory;
use mooncake_connector::connector::{
    Connector, ConnectorOptions, Consumer, PullRequest, WorkerContext,
};
use mooncake_connector::sim::kv_layouts::{plan_descriptors, BenchLayout};

use crate::prefill::PrefillProc;
use crate::report::{gib, print_header, write_dump, Row};
use crate::{config, env, fail, BenchPath, Opts};

/// Blocks of each region checked after a case (first, last, spread).
const SAMPLES_PER_REGION: usize = 16;

/// Starts the decode connector (TP 1) as a decode engine does
/// (`Connector::start`). For the TCP path its engine must neither use nor
/// offer the same-host path; the engine reads `MC_DISABLE_SAME_HOST_PATH`
/// when it is built, so the variable is set (or cleared) around the start
/// only (nothing else in this process reads it).
async fn decode_connector(layout: &BenchLayout, blocks: u64, path: BenchPath) -> Connector {
    match path {
        BenchPath::Tcp => std::env::set_var("MC_DISABLE_SAME_HOST_PATH", "1"),
        BenchPath::SameHost => std::env::remove_var("MC_DISABLE_SAME_HOST_PATH"),
    }
    let opts = ConnectorOptions {
        kv: config("kv_consumer", "bench-decode"),
        env: env(),
        cache: layout.cache_spec(1, blocks),
        tp: 1,
        pp: 1,
        dp_rank: 0,
    };
    // A consumer sends no events.
    let (events, _) = tokio::sync::mpsc::unbounded_channel();
    let connector = Connector::start(opts, events).await;
    std::env::remove_var("MC_DISABLE_SAME_HOST_PATH");
    connector.unwrap_or_else(|e| fail(format!("decode worker: {e}")))
}

/// Indices into a request's block list that are checked after a case.
pub(crate) fn sample_indices(n: usize, all: bool) -> Vec<usize> {
    if all || n <= SAMPLES_PER_REGION {
        return (0..n).collect();
    }
    let mut v: Vec<usize> = (0..SAMPLES_PER_REGION)
        .map(|k| k * (n - 1) / (SAMPLES_PER_REGION - 1))
        .collect();
    v.dedup();
    v
}

/// Where the decode cache keeps a block, and how the bench writes and
/// reads it (host memory through the worker, or a GPU buffer).
pub(crate) trait DecodeCache {
    fn offset(&self, region: usize, block: u64) -> usize;
    fn write(&mut self, off: usize, data: &[u8]) -> Result<(), String>;
    fn read(&self, off: usize, out: &mut [u8]) -> Result<(), String>;
}

impl DecodeCache for &WorkerContext {
    fn offset(&self, region: usize, block: u64) -> usize {
        self.block_offset(region, block)
    }
    fn write(&mut self, off: usize, data: &[u8]) -> Result<(), String> {
        self.kv.write_shared(off, data).map_err(|e| e.to_string())
    }
    fn read(&self, off: usize, out: &mut [u8]) -> Result<(), String> {
        self.kv.read_at(off, out).map_err(|e| e.to_string())
    }
}

/// Zeroes (`check == false`) or checks the sampled decode blocks of every
/// region against the pattern of the prefill blocks they came from.
pub(crate) fn sampled_blocks(
    layout: &BenchLayout,
    d: &mut impl DecodeCache,
    src: &[u64],
    dst: &[u64],
    samples: &[usize],
    check: bool,
) -> Result<usize, String> {
    let len = layout.block_bytes as usize;
    let zero = vec![0u8; len];
    let (mut want, mut got) = (vec![0u8; len], vec![0u8; len]);
    let mut checked = 0;
    for region in 0..layout.regions() {
        for &i in samples {
            let off = d.offset(region, dst[i]);
            if !check {
                d.write(off, &zero)?;
                continue;
            }
            layout.fill_block(1, 0, region, src[i], &mut want);
            d.read(off, &mut got)?;
            if want != got {
                let at = want.iter().zip(&got).position(|(a, b)| a != b).unwrap_or(0);
                return Err(format!(
                    "region {region}, prefill block {} -> decode block {}: byte {at} differs",
                    src[i], dst[i]
                ));
            }
            checked += 1;
        }
    }
    Ok(checked)
}

/// A layout's cache sizes for the largest prompt chosen: blocks per region
/// and bytes per rank on each side (decode has room for the scattered
/// pattern when it runs).
pub(crate) struct Sizes {
    pub(crate) p_blocks: u64,
    pub(crate) d_blocks: u64,
    pub(crate) src_bytes: u64,
    pub(crate) dst_bytes: u64,
}

impl Sizes {
    pub(crate) fn new(layout: &BenchLayout, opts: &Opts) -> Self {
        let max_tokens = *opts.tokens.iter().max().expect("at least one size");
        let tp = layout.prefill_tp;
        let p_blocks = layout.blocks_for(max_tokens) as u64;
        let d_blocks = if opts.scattered.contains(&true) {
            2 * p_blocks
        } else {
            p_blocks
        };
        let regions = layout.regions() as u64;
        Self {
            p_blocks,
            d_blocks,
            src_bytes: regions * p_blocks * layout.rank_block_bytes(tp),
            dst_bytes: regions * d_blocks * layout.block_bytes,
        }
    }
}

/// The prefill and decode blocks of an `n`-token prompt: decode block `b`
/// (contiguous) or `2b+1` (scattered) for prefill block `b`.
pub(crate) fn case_blocks(layout: &BenchLayout, n: usize, scattered: bool) -> (Vec<u64>, Vec<u64>) {
    let src: Vec<u64> = (0..layout.blocks_for(n) as u64).collect();
    let dst: Vec<u64> = if scattered {
        src.iter().map(|b| 2 * b + 1).collect()
    } else {
        src.clone()
    };
    (src, dst)
}

pub(crate) fn pattern_name(scattered: bool) -> &'static str {
    if scattered {
        "scattered"
    } else {
        "contiguous"
    }
}

pub(crate) async fn run(opts: Opts) {
    if let Some(dir) = &opts.dump {
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|e| fail(format!("cannot create {}: {e}", dir.display())));
    }
    if !opts.json {
        println!(
            "mooncake-rs connector KV transfer: prefill (child process) -> decode, 127.0.0.1, \
             1 request per pull, median of {} runs",
            opts.runs
        );
    }
    let mut seq = 0u64;
    for layout in &opts.layouts {
        let sizes = Sizes::new(layout, &opts);
        if !opts.json {
            let tp = layout.prefill_tp;
            let Sizes {
                p_blocks, d_blocks, ..
            } = sizes;
            println!(
                "\nlayout {}: {}\n  {} regions x {} bytes per block (prefill TP {tp}: {} bytes per rank) -> decode TP 1; \
                 caches: prefill {:.2} GiB per rank ({p_blocks} blocks/region), decode {:.2} GiB ({d_blocks} blocks/region)",
                layout.name,
                layout.description,
                layout.regions(),
                layout.block_bytes,
                layout.rank_block_bytes(tp),
                gib(sizes.src_bytes),
                gib(sizes.dst_bytes),
            );
            print_header("same-host");
        }
        for (pi, &path) in opts.paths.iter().enumerate() {
            run_path(&opts, layout, &sizes, path, pi == 0, &mut seq).await;
        }
    }
}

/// One layout over one path: a decode worker here, the prefill child, a
/// bootstrap server with the child's ranks registered, then every case.
/// The first path also writes the descriptor dumps.
async fn run_path(
    opts: &Opts,
    layout: &BenchLayout,
    sizes: &Sizes,
    path: BenchPath,
    first_path: bool,
    seq: &mut u64,
) {
    let decode = decode_connector(layout, sizes.d_blocks, path).await;
    let rank = &decode.ranks()[0];
    assert_eq!(
        rank.ctx.kv.len() as u64,
        sizes.dst_bytes,
        "decode buffer size"
    );
    let mut child = PrefillProc::spawn(layout, sizes.p_blocks, path);
    let line = child.expect("BOOTSTRAP");
    let child_bytes: u64 = line.get(1).and_then(|b| b.parse().ok()).unwrap_or(0);
    if child_bytes != sizes.src_bytes {
        fail(format!(
            "prefill buffer is {child_bytes} bytes, {} expected",
            sizes.src_bytes
        ));
    }
    let Some(bootstrap_url) = line.get(2).cloned() else {
        fail("prefill child: BOOTSTRAP without a URL")
    };
    let pass = Pass {
        opts,
        layout,
        sizes,
        path,
        first_path,
        decode: &rank.ctx,
        consumer: rank.consumer.as_ref().expect("the consumer role"),
        bootstrap_url,
    };
    for &n in &opts.tokens {
        for &scattered in &opts.scattered {
            run_case(&pass, &mut child, seq, n, scattered).await;
        }
    }
    drop(child);
    decode.shutdown().await;
}

/// What the cases of one layout over one path share.
struct Pass<'a> {
    opts: &'a Opts,
    layout: &'a BenchLayout,
    sizes: &'a Sizes,
    path: BenchPath,
    first_path: bool,
    decode: &'a WorkerContext,
    consumer: &'a Consumer,
    bootstrap_url: String,
}

/// What `--runs` pulls of one case added up to.
#[derive(Default)]
struct Totals {
    times: Vec<Duration>,
    /// Descriptors and bytes of one pull (the same for every run).
    descs: u64,
    bytes: u64,
    /// Engine requests over all runs.
    tcp: u64,
    same_host: u64,
}

/// One case (prompt size and pattern): plans (and dumps) its descriptors,
/// pulls it `--runs` times, checks the path taken and the bytes, prints
/// its row.
async fn run_case(
    pass: &Pass<'_>,
    child: &mut PrefillProc,
    seq: &mut u64,
    n: usize,
    scattered: bool,
) {
    let (opts, layout, sizes) = (pass.opts, pass.layout, pass.sizes);
    let pattern = pattern_name(scattered);
    let (src, dst) = case_blocks(layout, n, scattered);
    let planned = plan_descriptors(layout, sizes.p_blocks, sizes.d_blocks, &src, &dst)
        .unwrap_or_else(|e| fail(format!("planning {}: {e}", layout.name)));
    let planned_descs: u64 = planned.iter().map(|r| r.len() as u64).sum();
    let planned_bytes: u64 = planned.iter().flatten().map(|d| d.len).sum();
    if let (Some(dir), true) = (&opts.dump, pass.first_path) {
        write_dump(
            dir,
            layout,
            n,
            pattern,
            sizes.src_bytes,
            sizes.dst_bytes,
            &planned,
        );
    }
    let samples = sample_indices(src.len(), opts.verify_all);
    sampled_blocks(layout, &mut &*pass.decode, &src, &dst, &samples, false)
        .unwrap_or_else(|e| fail(e));
    let ids = src.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let label = format!("{} {n} {pattern}", layout.name);
    let mut t = Totals::default();
    for _ in 0..opts.runs {
        *seq += 1;
        pull_once(pass, child, *seq, &ids, &dst, &label, &mut t).await;
        if t.descs != planned_descs || t.bytes != planned_bytes {
            fail(format!(
                "{} {n} {pattern}: the producer sent {} descriptors / {} bytes, \
                 the plan (and dump) has {planned_descs} / {planned_bytes}",
                layout.name, t.descs, t.bytes
            ));
        }
    }
    let (tcp, same_host) = (t.tcp, t.same_host);
    match pass.path {
        BenchPath::SameHost if same_host == 0 => fail(format!(
            "{} {n} {pattern}: the same-host path was requested but not used \
             ({tcp} TCP requests, 0 same-host requests)",
            layout.name
        )),
        BenchPath::Tcp if same_host != 0 || tcp == 0 => fail(format!(
            "{} {n} {pattern}: TCP was requested but {same_host} same-host and {tcp} TCP requests were made",
            layout.name
        )),
        _ => {}
    }
    let path = pass.path.as_str();
    sampled_blocks(layout, &mut &*pass.decode, &src, &dst, &samples, true).unwrap_or_else(|e| {
        fail(format!(
            "{} {n} {pattern} {path}: wrong KV bytes: {e}",
            layout.name
        ))
    });
    // Engine requests per pull, for the table.
    let (tcp, same_host) = (tcp / opts.runs as u64, same_host / opts.runs as u64);
    t.times.sort();
    let ms = t.times[t.times.len() / 2].as_secs_f64() * 1e3;
    Row::new(layout.name, n, pattern, path, t.descs, t.bytes, ms).print(opts.json, tcp, same_host);
}

/// One pull of prefill blocks `ids` (comma-separated) into decode blocks
/// `dst`: arms the request in the child, times the pull, and adds the
/// child's report to `t`. `label` names the case in errors.
async fn pull_once(
    pass: &Pass<'_>,
    child: &mut PrefillProc,
    seq: u64,
    ids: &str,
    dst: &[u64],
    label: &str,
    t: &mut Totals,
) {
    let tid = format!("xfer-{seq}");
    child.send(&format!("READY {tid} p-{seq} {ids}"));
    child.expect("ARMED");
    let t0 = Instant::now();
    let out = pass
        .consumer
        .pull(
            &pass.bootstrap_url,
            "bench-prefill",
            vec![PullRequest {
                d_req_id: format!("d-{seq}"),
                transfer_id: tid.clone(),
                blocks: vec![dst.to_vec()],
            }],
        )
        .await;
    t.times.push(t0.elapsed());
    if !out.failed.is_empty() {
        fail(format!(
            "{label} {}: pull failed: {:?}",
            pass.path.as_str(),
            out.failed
        ));
    }
    let sent = child.expect("SENT");
    let num = |i: usize| -> u64 {
        sent.get(i)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| fail(format!("bad SENT line {sent:?}")))
    };
    if sent.get(1) != Some(&tid) {
        fail(format!("SENT for {:?}, {tid} expected", sent.get(1)));
    }
    (t.descs, t.bytes) = (num(2), num(3));
    t.tcp += num(4);
    t.same_host += num(5);
}
