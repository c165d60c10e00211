//! What the bench prints: table rows or JSON lines (`Row`), the table
//! header, and the `--dump-descriptors` files.
use std::io::Write;

use mooncake_connector::sim::kv_layouts::BenchLayout;
use serde::Serialize;

use crate::fail;

#[derive(Serialize)]
pub(crate) struct Row<'a> {
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
    pub(crate) fn new(
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
    pub(crate) fn print(&self, json: bool, tcp: u64, other: u64) {
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
pub(crate) fn print_header(other: &str) {
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

pub(crate) fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

pub(crate) fn write_dump(
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
