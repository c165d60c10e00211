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
//!   plans, as block lists where they take fewer engine calls than one
//!   request per merged run, i.e. for scattered blocks). Needs a CUDA
//!   build (`--features cuda12` or `cuda13`) and a GPU; exits 2 and says
//!   why without one. `--per-request` sends one request per descriptor
//!   instead, as before block lists (to compare in one run).
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
//!
//! This file holds the command line and `main`; `prefill.rs` the prefill
//! child and its pipe, `host.rs` the host-memory cases, `report.rs` the
//! table, JSON rows and descriptor dumps, `gpu.rs` the `--gpu` mode.
use std::path::PathBuf;

use mooncake_connector::connector::{ConnectorEnv, KvTransferConfig};
use mooncake_connector::sim::kv_layouts::{select_layouts, BenchLayout};

mod gpu;
mod host;
mod prefill;
mod report;

const DEFAULT_TOKENS: [usize; 5] = [128, 512, 2048, 8192, 32768];

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
    per_request: bool,
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
        per_request: false,
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
            "--per-request" => o.per_request = true,
            "--dump-descriptors" => o.dump = Some(PathBuf::from(value(args, &mut i, flag)?)),
            other => return Err(format!("unknown flag {other:?}")),
        }
        i += 1;
    }
    o.tokens.retain(|&t| t <= max_tokens);
    if o.tokens.is_empty() {
        return Err("no prompt size left (--tokens / --max-tokens)".into());
    }
    if o.per_request && !o.gpu {
        return Err("--per-request applies to --gpu runs".into());
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
        rt.block_on(prefill::prefill_child(&args[1..]));
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
    rt.block_on(host::run(opts));
}
