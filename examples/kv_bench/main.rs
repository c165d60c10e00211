//! KV transfer time from a prefill worker to a decode worker over the
//! connector (bootstrap lookup, ZMQ side channel, transfer engine writes on
//! 127.0.0.1), with KV caches laid out as real models lay them out.
//!
//! The decode worker (TP 1) runs in this process; the prefill worker(s) run
//! in a child process (this program re-executed with a hidden
//! `--prefill-child` flag, driven over its stdin/stdout), because the
//! engine's same-host path (Unix socket + `process_vm_readv/writev`) only
//! connects engines of different processes. For each layout, path, prompt
//! size and decode-block pattern, one request per pull; the time is the
//! median of `--runs` pulls, measured from sending the pull to its reply.
//! After every case, sampled blocks of every region (all blocks with
//! `--verify-all`) of the decode cache are compared with the pattern the
//! prefill side wrote, and the bench fails if they differ, if the producer's
//! descriptor count differs from the planned one, or if the requested path
//! was not the one taken (checked with the engine's request counters).
//!
//! Layouts (`--layout`, comma-separated; default `default`):
//! - `default`: 8 layers x 8 KV heads x 64 bytes, K+V in one region per
//!   layer, block 16 tokens (16 KiB per block and region).
//! - `llama8b`: 32 layers x 8 KV heads x 128 dims bf16, K and V as separate
//!   regions (64 regions), block 16 (32 KiB per block and region); also
//!   runs `llama8b-tp2to1`: two prefill ranks (TP 2, 4 heads each, 16 KiB
//!   per block) into one decode rank (TP 1).
//! - `mla`: 61 layers x one 576-value bf16 latent per token, block 64
//!   (73,728 bytes per block and region).
//! - `small`: 24 layers x 2 KV heads x 64 dims bf16, K and V separate (48
//!   regions), block 16 (4 KiB per block and region).
//! - `all`: every layout in turn (caches are allocated per layout and freed
//!   before the next).
//!
//! Other flags:
//! - `--tokens 128,2048` prompt sizes (default 128,512,2048,8192,32768);
//!   `--max-tokens N` drops larger ones.
//! - `--pattern contiguous|scattered|both` (default both): decode blocks
//!   `0..n` (runs merge into one descriptor per region when whole blocks
//!   move) or block `2b+1` for prefill block `b` (one descriptor per block
//!   and region).
//! - `--path tcp|same-host|both` (default both): `tcp` sets
//!   `MC_DISABLE_SAME_HOST_PATH=1` for both engines.
//! - `--runs N` (default 5), `--verify-all`.
//! - `--gpu`: both caches in GPU memory; paths `gpu-tcp` and `gpu-ipc`
//!   (see `gpu.rs`: the engine is driven directly with the connector's
//!   descriptor plans). Needs a CUDA build (`--features cuda12` or
//!   `cuda13`) and a GPU; exits 2 and says why without one.
//! - `--json`: one JSON object per case and line on stdout, with the keys
//!   `layout`, `tokens`, `pattern`, `path`, `descriptors` (as the producer
//!   counted them), `bytes`, `ms` (median), `gbps` (bytes/ms/1e6); nothing
//!   else goes to stdout. Otherwise a table goes to stdout. Logs go to
//!   stderr (`RUST_LOG`, default `warn`).
//! - `--dump-descriptors DIR`: writes `DIR/<layout>-<tokens>-<pattern>.json`
//!   per case, `{"layout", "tokens", "pattern", "src_bytes", "dst_bytes",
//!   "ranks": [{"descriptors": [[src_off, dst_off, len], ...]}, ...]}`: the
//!   descriptors each prefill rank sends, offsets relative to the start of
//!   its registered buffer (`src_bytes` each) and of the decode buffer
//!   (`dst_bytes`), so another engine can replay the same transfers. They
//!   come from the connector's own planning functions and are checked
//!   against the count the producer reports.
//!
//! Memory: caches are sized for the largest prompt chosen: prefill
//! `regions x blocks x block bytes`, decode twice that with the scattered
//! pattern. `llama8b` at 32k tokens: 4 GiB prefill + 8 GiB decode (the
//! TP 2 case: 2 x 2 GiB + 8 GiB); `mla`: 2.1 + 4.3 GiB; `small`: 0.75 +
//! 1.5 GiB; `default`: 0.25 + 0.5 GiB. Decode pages are only touched where
//! blocks land, but `--layout llama8b` at 32k needs about 12 GiB free (use
//! `--max-tokens 8192` on a smaller machine).
//!
//! ```text
//! cargo run --release --example kv_bench
//! cargo run --release --example kv_bench -- --layout llama8b --tokens 128,2048 --runs 3
//! cargo run --release --example kv_bench -- --layout all --runs 3 --json --dump-descriptors /tmp/kvdump
//! ```
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use mooncake::LocalMemory;
use mooncake_connector::connector::{
    Connector, ConnectorEnv, ConnectorOptions, ConnectorRank, Consumer, KvTransferConfig,
    ProducerEvent, PullRequest, WorkerContext,
};
use mooncake_connector::sim::kv_layouts::{
    all_layouts, plan_descriptors, select_layouts, BenchLayout,
};
use serde::Serialize;

mod gpu;

const DEFAULT_TOKENS: [usize; 5] = [128, 512, 2048, 8192, 32768];
/// Blocks of each region checked after a case (first, last, spread).
const SAMPLES_PER_REGION: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BenchPath {
    Tcp,
    SameHost,
}

impl BenchPath {
    fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::SameHost => "same-host",
        }
    }
}

struct Opts {
    layouts: Vec<BenchLayout>,
    tokens: Vec<usize>,
    scattered: Vec<bool>,
    paths: Vec<BenchPath>,
    runs: usize,
    json: bool,
    dump: Option<PathBuf>,
    verify_all: bool,
    gpu: bool,
}

fn value<'a>(args: &'a [String], i: &mut usize, flag: &str) -> Result<&'a str, String> {
    *i += 1;
    args.get(*i)
        .map(String::as_str)
        .ok_or_else(|| format!("{flag} needs a value"))
}

fn number(flag: &str, v: &str) -> Result<usize, String> {
    v.parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{flag}: {v:?} is not a positive integer"))
}

fn parse_opts(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        layouts: select_layouts("default")?,
        tokens: DEFAULT_TOKENS.to_vec(),
        scattered: vec![false, true],
        paths: vec![BenchPath::Tcp, BenchPath::SameHost],
        runs: 5,
        json: false,
        dump: None,
        verify_all: false,
        gpu: false,
    };
    let mut max_tokens = usize::MAX;
    let mut i = 0;
    while i < args.len() {
        let flag = args[i].as_str();
        match flag {
            "--layout" => o.layouts = select_layouts(value(args, &mut i, flag)?)?,
            "--tokens" => {
                o.tokens = value(args, &mut i, flag)?
                    .split(',')
                    .map(|t| number(flag, t.trim()))
                    .collect::<Result<_, _>>()?;
            }
            "--max-tokens" => max_tokens = number(flag, value(args, &mut i, flag)?)?,
            "--runs" => o.runs = number(flag, value(args, &mut i, flag)?)?,
            "--pattern" => {
                o.scattered = match value(args, &mut i, flag)? {
                    "contiguous" => vec![false],
                    "scattered" => vec![true],
                    "both" => vec![false, true],
                    v => {
                        return Err(format!(
                            "--pattern: {v:?} is not contiguous, scattered or both"
                        ))
                    }
                }
            }
            "--path" => {
                o.paths = match value(args, &mut i, flag)? {
                    "tcp" => vec![BenchPath::Tcp],
                    "same-host" | "ipc" | "gpu-ipc" | "gpu-same-host" => vec![BenchPath::SameHost],
                    "both" => vec![BenchPath::Tcp, BenchPath::SameHost],
                    v => return Err(format!("--path: {v:?} is not tcp, same-host or both")),
                }
            }
            "--json" => o.json = true,
            "--verify-all" => o.verify_all = true,
            "--gpu" => o.gpu = true,
            "--dump-descriptors" => o.dump = Some(PathBuf::from(value(args, &mut i, flag)?)),
            other => return Err(format!("unknown flag {other:?}")),
        }
        i += 1;
    }
    o.tokens.retain(|&t| t <= max_tokens);
    if o.tokens.is_empty() {
        return Err("no prompt size left (--tokens / --max-tokens)".into());
    }
    if o.gpu && o.dump.is_some() {
        return Err("--dump-descriptors describes host-mode runs; leave out --gpu".into());
    }
    Ok(o)
}

fn config(role: &str, engine_id: &str) -> KvTransferConfig {
    KvTransferConfig::from_json(&format!(
        r#"{{"kv_connector":"MooncakeConnector","kv_role":"{role}","engine_id":"{engine_id}","kv_connector_extra_config":{{"mooncake_protocol":"tcp"}}}}"#
    ))
    .expect("static connector config")
}

fn env() -> ConnectorEnv {
    ConnectorEnv {
        host_ip: "127.0.0.1".into(),
        ..ConnectorEnv::default()
    }
}

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("kv_bench: {msg}");
    std::process::exit(1);
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(format!("tokio runtime: {e}")));
    if args.first().map(String::as_str) == Some("--prefill-child") {
        rt.block_on(prefill_child(&args[1..]));
        return;
    }
    if args.first().map(String::as_str) == Some("--gpu-prefill-child") {
        gpu::prefill_child(&args[1..]);
        return;
    }
    let opts = match parse_opts(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("kv_bench: {e}");
            std::process::exit(2);
        }
    };
    if opts.gpu {
        gpu::run(&opts);
        return;
    }
    rt.block_on(run(opts));
}

// ---------------------------------------------------------------- child --

/// Prefill side: `--prefill-child <layout> <blocks per region>`. Starts the
/// connector as a prefill engine does (`Connector::start`: one producer per
/// TP rank, the embedded bootstrap server on 127.0.0.1, every rank
/// registered there as `bench-prefill`), fills its caches, prints
/// `BOOTSTRAP <buffer bytes per rank> <bootstrap server URL>`,
/// then serves stdin lines `READY <transfer_id> <p_req_id> <block ids,>`:
/// marks the request ready on every rank, answers `ARMED <transfer_id>`,
/// and once every rank has sent it, `SENT <transfer_id> <descriptors>
/// <bytes> <tcp requests> <same-host requests>` (this request's share of
/// the connector's and engines' counters). Exits at end of input.
async fn prefill_child(args: &[String]) {
    let (Some(name), Some(blocks)) = (args.first(), args.get(1)) else {
        fail("--prefill-child needs <layout> <blocks>")
    };
    let layout = all_layouts()
        .into_iter()
        .find(|l| l.name == name.as_str())
        .unwrap_or_else(|| fail(format!("unknown layout {name:?}")));
    let num_blocks: u64 = blocks
        .parse()
        .unwrap_or_else(|_| fail(format!("bad block count {blocks:?}")));
    let tp = layout.prefill_tp;
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let connector = start_prefill(&layout, num_blocks, tx).await;
    let stats = connector.stats().clone();
    let ranks = connector.ranks();
    println!(
        "BOOTSTRAP {} {}",
        ranks[0].ctx.kv.len(),
        connector.bootstrap_url().expect("a producer registers")
    );
    // Blocking stdin lines, handed to the runtime.
    let (line_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if line_tx.send(line).is_err() {
                break;
            }
        }
    });
    while let Some(line) = lines.recv().await {
        let mut f = line.split(' ');
        let (Some("READY"), Some(tid), Some(preq), Some(ids)) =
            (f.next(), f.next(), f.next(), f.next())
        else {
            fail(format!("prefill child: unexpected command {line:?}"))
        };
        let ids: Vec<u64> = ids
            .split(',')
            .map(|b| {
                b.parse()
                    .unwrap_or_else(|_| fail(format!("bad block id {b:?}")))
            })
            .collect();
        let before = stats.snapshot();
        let (tcp0, sh0) = engine_requests(ranks);
        connector.request_ready(tid, preq, vec![ids]);
        println!("ARMED {tid}");
        let mut finished = 0;
        while finished < tp {
            match events.recv().await {
                Some(ProducerEvent::FinishedSending { transfer_id, .. }) if transfer_id == tid => {
                    finished += 1
                }
                Some(ProducerEvent::FinishedSending { .. }) => {}
                Some(ProducerEvent::Expired { transfer_id, .. }) => fail(format!(
                    "prefill child: transfer {transfer_id} expired unsent"
                )),
                None => fail("prefill child: producer events closed"),
            }
        }
        let after = stats.snapshot();
        let (tcp1, sh1) = engine_requests(ranks);
        println!(
            "SENT {tid} {} {} {} {}",
            after.descriptors_sent - before.descriptors_sent,
            after.bytes_sent - before.bytes_sent,
            tcp1 - tcp0,
            sh1 - sh0
        );
    }
}

/// The prefill connector for `layout` (`bench-prefill`, TP `prefill_tp`),
/// each rank's cache filled with the layout's pattern.
async fn start_prefill(
    layout: &BenchLayout,
    num_blocks: u64,
    events: tokio::sync::mpsc::UnboundedSender<ProducerEvent>,
) -> Connector {
    let tp = layout.prefill_tp;
    let opts = ConnectorOptions {
        kv: config("kv_producer", "bench-prefill"),
        // The embedded bootstrap server on a free port.
        env: ConnectorEnv {
            bootstrap_port: 0,
            ..env()
        },
        cache: layout.cache_spec(tp, num_blocks),
        tp,
        dp_rank: 0,
    };
    let connector = Connector::start(opts, events)
        .await
        .unwrap_or_else(|e| fail(format!("prefill connector: {e}")));
    let mut buf = vec![0u8; layout.rank_block_bytes(tp) as usize];
    for (rank, r) in connector.ranks().iter().enumerate() {
        for region in 0..layout.regions() {
            for b in 0..num_blocks {
                layout.fill_block(tp, rank, region, b, &mut buf);
                r.ctx
                    .kv
                    .write_shared(r.ctx.block_offset(region, b), &buf)
                    .unwrap_or_else(|e| fail(e));
            }
        }
    }
    connector
}

/// The TCP and same-host requests the ranks' engines made so far.
fn engine_requests(ranks: &[ConnectorRank]) -> (u64, u64) {
    ranks.iter().fold((0u64, 0u64), |(t, s), r| {
        let c = r.ctx.engine.counters().unwrap_or_else(|e| fail(e));
        (t + c.tcp_requests_sent, s + c.same_host_requests)
    })
}

// --------------------------------------------------------------- parent --

/// The prefill child process and its command pipe.
struct PrefillProc {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl PrefillProc {
    fn spawn(layout: &BenchLayout, blocks: u64, path: BenchPath) -> Self {
        let disable_same_host = match path {
            BenchPath::Tcp => Some("1"),
            BenchPath::SameHost => None,
        };
        Self::spawn_with(
            &["--prefill-child", layout.name, &blocks.to_string()],
            disable_same_host,
        )
    }

    /// This program again with `args`, and `MC_DISABLE_SAME_HOST_PATH` set
    /// to `disable_same_host` (or removed).
    fn spawn_with(args: &[&str], disable_same_host: Option<&str>) -> Self {
        let exe = std::env::current_exe().unwrap_or_else(|e| fail(format!("current_exe: {e}")));
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        match disable_same_host {
            Some(v) => cmd.env("MC_DISABLE_SAME_HOST_PATH", v),
            None => cmd.env_remove("MC_DISABLE_SAME_HOST_PATH"),
        };
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| fail(format!("cannot start the prefill child: {e}")));
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Self {
            child,
            stdin,
            stdout,
        }
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        if let Err(e) = writeln!(stdin, "{line}").and_then(|_| stdin.flush()) {
            fail(format!("prefill child: {e}"));
        }
    }

    /// The next line, split on spaces; its first word must be `tag`.
    fn expect(&mut self, tag: &str) -> Vec<String> {
        let mut line = String::new();
        let n = tokio::task::block_in_place(|| self.stdout.read_line(&mut line))
            .unwrap_or_else(|e| fail(format!("prefill child: {e}")));
        if n == 0 {
            fail(format!("prefill child exited while {tag} was expected"));
        }
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        if words.first().map(String::as_str) != Some(tag) {
            fail(format!("prefill child said {line:?}, {tag} expected"));
        }
        words
    }
}

impl Drop for PrefillProc {
    fn drop(&mut self) {
        // End of input stops the child; kill it (by its PID) if it hangs.
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Serialize)]
struct Row<'a> {
    layout: &'a str,
    tokens: usize,
    pattern: &'a str,
    path: &'a str,
    descriptors: u64,
    bytes: u64,
    ms: f64,
    gbps: f64,
}

impl<'a> Row<'a> {
    fn new(
        layout: &'a str,
        tokens: usize,
        pattern: &'a str,
        path: &'a str,
        descriptors: u64,
        bytes: u64,
        ms: f64,
    ) -> Self {
        Self {
            layout,
            tokens,
            pattern,
            path,
            descriptors,
            bytes,
            ms,
            gbps: bytes as f64 / ms / 1e6,
        }
    }

    /// One JSON line, or a table row whose last two columns are the
    /// engine's requests per pull (TCP, then the other path).
    fn print(&self, json: bool, tcp: u64, other: u64) {
        if json {
            println!("{}", serde_json::to_string(self).expect("plain struct"));
        } else {
            println!(
                "{:>7} {:>10} {:>9} {:>11} {:>12} {:>9.2} {:>8.2} {tcp:>9} {other:>10}",
                self.tokens,
                self.pattern,
                self.path,
                self.descriptors,
                self.bytes,
                self.ms,
                self.gbps
            );
        }
    }
}

/// The table's header; `other` names the last column.
fn print_header(other: &str) {
    println!(
        "{:>7} {:>10} {:>9} {:>11} {:>12} {:>9} {:>8} {:>9} {:>10}",
        "tokens", "pattern", "path", "descriptors", "KV bytes", "ms", "GB/s", "tcp reqs", other
    );
}

#[derive(Serialize)]
struct Dump<'a> {
    layout: &'a str,
    tokens: usize,
    pattern: &'a str,
    src_bytes: u64,
    dst_bytes: u64,
    ranks: Vec<DumpRank>,
}

#[derive(Serialize)]
struct DumpRank {
    descriptors: Vec<[u64; 3]>,
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

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
        dp_rank: 0,
    };
    // A consumer sends no events.
    let (events, _) = tokio::sync::mpsc::unbounded_channel();
    let connector = Connector::start(opts, events).await;
    std::env::remove_var("MC_DISABLE_SAME_HOST_PATH");
    connector.unwrap_or_else(|e| fail(format!("decode worker: {e}")))
}

/// Indices into a request's block list that are checked after a case.
fn sample_indices(n: usize, all: bool) -> Vec<usize> {
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
trait DecodeCache {
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
fn sampled_blocks(
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

fn write_dump(
    dir: &std::path::Path,
    layout: &BenchLayout,
    tokens: usize,
    pattern: &str,
    src_bytes: u64,
    dst_bytes: u64,
    planned: &[Vec<mooncake_connector::connector::regions::Descriptor>],
) {
    let dump = Dump {
        layout: layout.name,
        tokens,
        pattern,
        src_bytes,
        dst_bytes,
        ranks: planned
            .iter()
            .map(|r| DumpRank {
                descriptors: r.iter().map(|d| [d.src, d.dst, d.len]).collect(),
            })
            .collect(),
    };
    let file = dir.join(format!("{}-{tokens}-{pattern}.json", layout.name));
    let res = std::fs::File::create(&file)
        .map_err(|e| e.to_string())
        .and_then(|f| {
            let mut w = std::io::BufWriter::new(f);
            serde_json::to_writer(&mut w, &dump).map_err(|e| e.to_string())?;
            w.flush().map_err(|e| e.to_string())
        });
    if let Err(e) = res {
        fail(format!("cannot write {}: {e}", file.display()));
    }
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

async fn run(opts: Opts) {
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
