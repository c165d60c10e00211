//! The prefill side of the bench: the child process (`--prefill-child`,
//! a prefill connector serving pulls) and the parent's handle on it
//! (`PrefillProc`, its command pipe), also used by the `--gpu` mode.
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use mooncake::LocalMemory;
use mooncake_connector::connector::{
    Connector, ConnectorEnv, ConnectorOptions, ConnectorRank, ProducerEvent,
};
use mooncake_connector::sim::kv_layouts::{all_layouts, BenchLayout};

use crate::{config, env, fail, BenchPath};

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
pub(crate) async fn prefill_child(args: &[String]) {
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
        pp: 1,
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
pub(crate) struct PrefillProc {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl PrefillProc {
    pub(crate) fn spawn(layout: &BenchLayout, blocks: u64, path: BenchPath) -> Self {
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
    pub(crate) fn spawn_with(args: &[&str], disable_same_host: Option<&str>) -> Self {
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

    pub(crate) fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        if let Err(e) = writeln!(stdin, "{line}").and_then(|_| stdin.flush()) {
            fail(format!("prefill child: {e}"));
        }
    }

    /// The next line, split on spaces; its first word must be `tag`.
    pub(crate) fn expect(&mut self, tag: &str) -> Vec<String> {
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
