//! Criterion benchmarks of the engine through the safe API (and the raw C
//! ABI for comparison), all on 127.0.0.1 with both engines in this process:
//!
//! - `submit_4k_x32_cpu`: one round of a 32-request batch of 4 KiB (queue,
//!   submit, wait, reset) through the safe API and through `mooncake-sys`
//!   directly, to the engine's own segment: no network, so what is measured
//!   is API and engine overhead, all of it done by the calling thread (the
//!   copies run inside submit), measured in that thread's CPU time, which
//!   other tenants' load (steal time) does not inflate;
//! - `submit_4k_x32`: the same over TCP (wall-clock);
//! - `tcp_block_size`: TCP throughput by block size, 4 KiB to 16 MiB;
//! - `tcp_batch_size`: TCP throughput by batch size, 1 to 256 (64 KiB);
//! - `same_host_block_size`: both engines with the same-host path on; as
//!   they share this process, the target refuses that path by design (it
//!   serves only other processes) and this measures the TCP fallback; the
//!   same-host path itself is measured across two processes by
//!   `examples/transfer_engine_bench.rs` (`scripts/perf_compare.py`);
//! - `register_1gib`: registering and unregistering 1 GiB of host memory;
//! - `batch_descriptors`: one batch of 1k, 16k and 128k small (64-byte)
//!   requests queued, submitted, waited for and every status read, through
//!   the safe API, to the engine's own segment (`local`: bookkeeping only)
//!   and over TCP; throughput in descriptors per second. It also prints the
//!   memory a 128k batch costs per descriptor (resident-set growth of one
//!   round in a fresh batch, Rust and engine sides together).
//!   `local_block_list`: the same number of 64-byte pieces as one block
//!   list (64 regions, ids reversed on one side) to the engine's own
//!   segment, where the engine hands the pieces to its local copy loop.
//!
//! Measurement times are short (`cargo bench -p mooncake` takes a few
//! minutes); `cargo test` runs each benchmark once.
use std::ffi::CString;
use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mooncake::{
    sys, Access, Batch, BlockRegion, Engine, HostBuffer, Opcode, Registration, RemoteSegment,
    TaskStatus,
};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn engine(same_host: bool) -> Engine {
    Engine::builder()
        .local_host("127.0.0.1")
        .same_host_path(same_host)
        .build()
        .expect("engine")
}

/// A target publishing `size` bytes and an initiator with `size` bytes.
struct Pair {
    _target: Engine,
    init: Engine,
    _published: Registration<HostBuffer>,
    local: Registration<HostBuffer>,
    seg: RemoteSegment,
    base: u64,
}

impl Pair {
    fn new(same_host: bool, size: usize) -> Self {
        let target = engine(same_host);
        let init = engine(same_host);
        let published = target
            .register(
                HostBuffer::new(size).unwrap(),
                "*",
                Access::RemoteAccessible,
            )
            .unwrap();
        let local = init
            .register(HostBuffer::new(size).unwrap(), "*", Access::LocalOnly)
            .unwrap();
        let seg = init.open_segment(target.segment_name()).unwrap();
        let base = seg.buffers().unwrap()[0].addr;
        Self {
            _target: target,
            init,
            _published: published,
            local,
            seg,
            base,
        }
    }
}

fn round<'r>(
    b: &mut Batch<'r>,
    local: &'r Registration<HostBuffer>,
    seg: &RemoteSegment,
    base: u64,
    n: usize,
    block: usize,
) {
    for i in 0..n {
        let off = i * block;
        b.read(local, off, seg, base + off as u64, block).unwrap();
    }
    b.submit().unwrap();
    b.wait(None).unwrap();
    b.reset().unwrap();
}

/// The same round through the C ABI only: an engine of its own, a batch
/// allocated once, prebuilt requests.
struct Raw {
    engine: sys::transfer_engine_t,
    batch: u64,
    reqs: Vec<sys::transfer_request>,
    status: Vec<sys::transfer_status>,
    _mem: Vec<Vec<u8>>,
    _peer: Option<sys::transfer_engine_t>,
}

impl Raw {
    fn create(same_host: bool) -> sys::transfer_engine_t {
        let host = CString::new("127.0.0.1").unwrap();
        let mut cfg = sys::mc_engine_config_t::default();
        // SAFETY: `cfg` is a valid config struct; `host` outlives the call
        // (the engine copies it).
        unsafe {
            assert_eq!(sys::mc_engine_config_default(&mut cfg), 0);
            cfg.local_server_name = host.as_ptr();
            cfg.bind_address = host.as_ptr();
            cfg.enable_same_host = u32::from(same_host);
            let e = sys::mc_engine_create(&cfg);
            assert!(!e.is_null());
            e
        }
    }

    fn register(e: sys::transfer_engine_t, mem: &mut [u8], remote: bool) {
        let loc = CString::new("*").unwrap();
        // SAFETY: `mem` stays allocated (and unmoved) until the engine that
        // registered it is destroyed in `Drop`.
        let rc = unsafe {
            sys::registerLocalMemory(
                e,
                mem.as_mut_ptr().cast(),
                mem.len(),
                loc.as_ptr(),
                i32::from(remote),
            )
        };
        assert_eq!(rc, 0);
    }

    /// `n` requests of `block` bytes: to the engine's own segment when
    /// `tcp` is false, else READs from a second engine over TCP.
    fn new(n: usize, block: usize, tcp: bool) -> Self {
        let engine = Self::create(false);
        let mut src = vec![1u8; n * block];
        let mut dst = vec![0u8; n * block];
        let (peer, seg, remote_base, op) = if tcp {
            let peer = Self::create(false);
            Self::register(peer, &mut src, true);
            Self::register(engine, &mut dst, false);
            let mut name = [0 as std::ffi::c_char; 128];
            let mut needed = 0usize;
            // SAFETY: `name` is writable for its length; the engine NUL-terminates.
            let seg = unsafe {
                assert_eq!(
                    sys::mc_engine_segment_name(peer, name.as_mut_ptr(), name.len(), &mut needed),
                    0
                );
                sys::openSegment(engine, name.as_ptr())
            };
            assert!(seg >= 0);
            (Some(peer), seg, src.as_ptr() as u64, sys::OPCODE_READ)
        } else {
            Self::register(engine, &mut src, true);
            Self::register(engine, &mut dst, false);
            (
                None,
                sys::LOCAL_SEGMENT as i32,
                src.as_ptr() as u64,
                sys::OPCODE_READ,
            )
        };
        let reqs = (0..n)
            .map(|i| sys::transfer_request {
                opcode: op as i32,
                // Written only by the engine, while registered.
                source: dst.as_mut_ptr().wrapping_add(i * block).cast(),
                target_id: seg,
                target_offset: remote_base + (i * block) as u64,
                length: block as u64,
            })
            .collect();
        // SAFETY: plain call on a live engine.
        let batch = unsafe { sys::allocateBatchID(engine, n) };
        assert_ne!(batch, sys::INVALID_BATCH);
        Self {
            engine,
            batch,
            reqs,
            status: vec![sys::transfer_status::default(); n],
            _mem: vec![src, dst],
            _peer: peer,
        }
    }

    fn round(&mut self) {
        let mut count = 0usize;
        // SAFETY: the requests point into registered memory owned by
        // `self`; the status array is writable for its length.
        unsafe {
            assert_eq!(
                sys::submitTransfer(
                    self.engine,
                    self.batch,
                    self.reqs.as_mut_ptr(),
                    self.reqs.len()
                ),
                0
            );
            assert_eq!(sys::mc_batch_wait(self.engine, self.batch, -1), 0);
            assert_eq!(
                sys::mc_batch_status(
                    self.engine,
                    self.batch,
                    self.status.as_mut_ptr(),
                    self.status.len(),
                    &mut count
                ),
                0
            );
            assert_eq!(sys::mc_batch_reset(self.engine, self.batch), 0);
        }
        assert!(self
            .status
            .iter()
            .all(|s| s.status == sys::STATUS_COMPLETED as i32));
        black_box(count);
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: the batch is idle (every round waited), the engines are
        // destroyed once, before the memory they registered is freed.
        unsafe {
            sys::freeBatchID(self.engine, self.batch);
            sys::destroyTransferEngine(self.engine);
            if let Some(p) = self._peer {
                sys::destroyTransferEngine(p);
            }
        }
    }
}

/// CPU time of the calling thread, in nanoseconds.
struct ThreadCpu;

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Measurement for ThreadCpu {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, i: u64) -> u64 {
        thread_cpu_ns() - i
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (div, unit) = match typical {
            t if t < 1e3 => (1.0, "ns cpu"),
            t if t < 1e6 => (1e3, "µs cpu"),
            t if t < 1e9 => (1e6, "ms cpu"),
            _ => (1e9, "s cpu"),
        };
        values.iter_mut().for_each(|v| *v /= div);
        unit
    }
    fn scale_throughputs(&self, _typical: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        let (n, unit) = match t {
            Throughput::Bytes(b) | Throughput::BytesDecimal(b) => {
                (*b as f64 / (1u64 << 30) as f64, "GiB/s cpu")
            }
            Throughput::Elements(e) => (*e as f64, "elem/s cpu"),
        };
        values.iter_mut().for_each(|v| *v = n * 1e9 / *v);
        unit
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn submit_overhead_cpu(c: &mut Criterion<ThreadCpu>) {
    const N: usize = 32;
    const BLOCK: usize = 4 * KIB;
    let mut g = c.benchmark_group("submit_4k_x32_cpu");
    g.throughput(Throughput::Bytes((N * BLOCK) as u64));
    {
        let mut raw = Raw::new(N, BLOCK, false);
        g.bench_function(BenchmarkId::new("raw", "local"), |b| b.iter(|| raw.round()));
    }
    {
        let e = engine(false);
        let published = e
            .register(
                HostBuffer::new(N * BLOCK).unwrap(),
                "*",
                Access::RemoteAccessible,
            )
            .unwrap();
        let local = e
            .register(HostBuffer::new(N * BLOCK).unwrap(), "*", Access::LocalOnly)
            .unwrap();
        let seg = e.local_segment();
        let base = mooncake::LocalMemory::addr(&published);
        let mut batch = e.batch(N).unwrap();
        g.bench_function(BenchmarkId::new("safe", "local"), |b| {
            b.iter(|| round(&mut batch, &local, &seg, base, N, BLOCK))
        });
    }
    g.finish();
}

fn submit_overhead(c: &mut Criterion) {
    const N: usize = 32;
    const BLOCK: usize = 4 * KIB;
    let mut g = c.benchmark_group("submit_4k_x32");
    g.throughput(Throughput::Bytes((N * BLOCK) as u64));
    {
        let mut raw = Raw::new(N, BLOCK, true);
        g.bench_function(BenchmarkId::new("raw", "tcp"), |b| b.iter(|| raw.round()));
    }
    {
        let p = Pair::new(false, N * BLOCK);
        let mut batch = p.init.batch(N).unwrap();
        g.bench_function(BenchmarkId::new("safe", "tcp"), |b| {
            b.iter(|| round(&mut batch, &p.local, &p.seg, p.base, N, BLOCK))
        });
    }
    g.finish();
}

fn throughput_by_block(c: &mut Criterion, name: &str, same_host: bool) {
    let mut g = c.benchmark_group(name);
    for block in [4 * KIB, 64 * KIB, MIB, 16 * MIB] {
        let n = (64 * MIB / block).clamp(1, 32);
        let p = Pair::new(same_host, n * block);
        let mut batch = p.init.batch(n).unwrap();
        g.throughput(Throughput::Bytes((n * block) as u64));
        g.bench_with_input(BenchmarkId::from_parameter(block), &block, |b, &block| {
            b.iter(|| round(&mut batch, &p.local, &p.seg, p.base, n, block))
        });
    }
    g.finish();
}

fn tcp_block_size(c: &mut Criterion) {
    throughput_by_block(c, "tcp_block_size", false);
}

fn same_host_block_size(c: &mut Criterion) {
    throughput_by_block(c, "same_host_block_size", true);
}

fn tcp_batch_size(c: &mut Criterion) {
    const BLOCK: usize = 64 * KIB;
    let mut g = c.benchmark_group("tcp_batch_size");
    let p = Pair::new(false, 256 * BLOCK);
    for n in [1usize, 8, 32, 256] {
        let mut batch = p.init.batch(n).unwrap();
        g.throughput(Throughput::Bytes((n * BLOCK) as u64));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter(|| round(&mut batch, &p.local, &p.seg, p.base, n, BLOCK))
        });
    }
    g.finish();
}

/// Resident set size of this process, in bytes (Linux).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// One round of `n` 64-byte READs (spread over a 1 MiB window, so the
/// registered memory stays small whatever `n` is), every status read.
fn descriptor_round<'r>(
    b: &mut Batch<'r>,
    local: &'r Registration<HostBuffer>,
    seg: &RemoteSegment,
    base: u64,
    n: usize,
) {
    const LEN: usize = 64;
    const WINDOW: usize = MIB / LEN;
    for i in 0..n {
        let off = (i % WINDOW) * LEN;
        b.read(local, off, seg, base + off as u64, LEN).unwrap();
    }
    b.submit().unwrap();
    b.wait(None).unwrap();
    let st = b.statuses().unwrap();
    assert_eq!(st.not_completed().count(), 0);
    black_box(st.len());
    b.reset().unwrap();
}

fn batch_descriptors(c: &mut Criterion) {
    let p = Pair::new(false, MIB);
    // Requests to the initiator's own segment need a remote-accessible
    // target: the first MiB is the destination, the second the source.
    let own = p
        .init
        .register(
            HostBuffer::new(2 * MIB).unwrap(),
            "*",
            Access::RemoteAccessible,
        )
        .unwrap();
    let local_seg = p.init.local_segment();
    let own_src = mooncake::LocalMemory::addr(&own) + MIB as u64;
    // Memory per descriptor at 128k: a fresh batch's first round, measured
    // as resident-set growth (allocations that stay mapped), once.
    {
        const N: usize = 128 * 1024;
        let before = rss_bytes();
        let mut batch = p.init.batch(N).unwrap();
        descriptor_round(&mut batch, &p.local, &p.seg, p.base, N);
        let after = rss_bytes();
        eprintln!(
            "batch_descriptors: a {N}-request batch grew the resident set by {} bytes per descriptor",
            after.saturating_sub(before) / N as u64
        );
    }
    let mut g = c.benchmark_group("batch_descriptors");
    for n in [1024usize, 16 * 1024, 128 * 1024] {
        g.throughput(Throughput::Elements(n as u64));
        let mut batch = p.init.batch(n).unwrap();
        let mut own_batch = p.init.batch(n).unwrap();
        g.bench_with_input(BenchmarkId::new("local", n), &n, |b, &n| {
            b.iter(|| descriptor_round(&mut own_batch, &own, &local_seg, own_src, n))
        });
        g.bench_with_input(BenchmarkId::new("tcp", n), &n, |b, &n| {
            b.iter(|| descriptor_round(&mut batch, &p.local, &p.seg, p.base, n))
        });
        // The same pieces as one block list: 64 regions of n / 64 blocks.
        let per = (n / 64) as u64;
        let list_mem = p
            .init
            .register(
                HostBuffer::new(2 * n * 64).unwrap(),
                "*",
                Access::RemoteAccessible,
            )
            .unwrap();
        let half = (n * 64) as u64;
        let list_src = mooncake::LocalMemory::addr(&list_mem) + half;
        let regions: Vec<BlockRegion> = (0..64)
            .map(|r| BlockRegion::packed(r * per * 64, list_src + r * per * 64, 64))
            .collect();
        let ids: Vec<u64> = (0..per).collect();
        let reversed: Vec<u64> = (0..per).rev().collect();
        let mut list_batch = p.init.batch(1).unwrap();
        g.bench_with_input(BenchmarkId::new("local_block_list", n), &n, |b, _| {
            b.iter(|| {
                let t = list_batch
                    .submit_blocks(
                        Opcode::Read,
                        &list_mem,
                        &local_seg,
                        &regions,
                        &ids,
                        &reversed,
                    )
                    .unwrap();
                list_batch.wait(None).unwrap();
                assert_eq!(list_batch.status(t).unwrap(), TaskStatus::Completed);
                list_batch.reset().unwrap();
            })
        });
    }
    g.finish();
}

fn register_1gib(c: &mut Criterion) {
    let e = engine(false);
    let mut mem = vec![0u8; 1 << 30];
    // Fault every page in first: the benchmark measures registration, not
    // the kernel handing out memory.
    for i in (0..mem.len()).step_by(4096) {
        mem[i] = 1;
    }
    let mut g = c.benchmark_group("register_1gib");
    g.throughput(Throughput::Bytes(mem.len() as u64));
    g.bench_function("register_unregister", |b| {
        b.iter(|| {
            e.with_registered(&mut mem, Access::RemoteAccessible, |r| {
                black_box(mooncake::LocalMemory::len(r));
            })
            .unwrap()
        })
    });
    g.finish();
}

/// One READ of 4 KiB or 1 MiB over TCP, submitted and waited for: the
/// blocking `Batch::wait` against the future of an `AsyncBatch` (woken by
/// the engine's reactor thread), same engines, same request. The time is
/// the round's, so the difference is what the future's path adds.
#[cfg(feature = "async")]
fn completion_latency(c: &mut Criterion) {
    use std::sync::Arc;
    let mut g = c.benchmark_group("completion_latency");
    for &size in &[4 * KIB, MIB] {
        let p = Pair::new(false, size);
        let label = if size == MIB { "1m" } else { "4k" };
        let mut b = p.init.batch(1).unwrap();
        g.bench_function(BenchmarkId::new("blocking", label), |bench| {
            bench.iter(|| round(&mut b, &p.local, &p.seg, p.base, 1, size))
        });
        drop(b);
        let local = Arc::new(
            p.init
                .register(HostBuffer::new(size).unwrap(), "*", Access::LocalOnly)
                .unwrap(),
        );
        let mut ab = p.init.async_batch(1).unwrap();
        g.bench_function(BenchmarkId::new("async", label), |bench| {
            bench.iter(|| {
                ab.read(&local, 0, &p.seg, p.base, size).unwrap();
                futures::executor::block_on(ab.run()).unwrap();
                ab.reset().unwrap();
            })
        });
    }
    g.finish();
}

#[cfg(not(feature = "async"))]
fn completion_latency(_: &mut Criterion) {}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(10)
}

criterion_group! {
    name = cpu;
    config = Criterion::default()
        .with_measurement(ThreadCpu)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = submit_overhead_cpu
}
criterion_group! {
    name = benches;
    config = config();
    targets = submit_overhead, tcp_block_size, tcp_batch_size, same_host_block_size, batch_descriptors, register_1gib, completion_latency
}
criterion_main!(cpu, benches);
