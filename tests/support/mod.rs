//! Peer processes for integration tests: our `mooncake-peer` and the
//! upstream engine's twin (`tests/interop/upstream_peer.py`), both speaking
//! the line protocol of `mooncake_connector::peer_protocol`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use libtest_mimic::Trial;

pub mod stores;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Our engine (`mooncake-peer`).
    Ours,
    /// Upstream Mooncake 0.3.13 (Python wheel).
    Upstream,
}

pub struct PeerProc {
    pub kind: Kind,
    pub segment: String,
    pub addr: u64,
    pub len: usize,
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

/// The Python interpreter that has the upstream wheel, if any.
pub fn upstream_python() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("MOONCAKE_UPSTREAM_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv-upstream/bin/python");
    p.exists().then_some(p)
}

/// An upstream interop test, reported by its own harness (libtest-mimic):
/// it runs when the upstream engine is installed; otherwise it is listed as
/// *ignored* with the reason on stderr (never as passed), unless CI sets
/// MOONCAKE_REQUIRE_UPSTREAM=1, where a missing engine fails it. An ignored
/// one still runs for real under `--include-ignored`.
pub fn upstream_trial(name: &'static str, f: impl FnOnce() + Send + 'static) -> Trial {
    let test = Trial::test(name, move || {
        f();
        Ok(())
    });
    if upstream_python().is_some() {
        return test;
    }
    if std::env::var("MOONCAKE_REQUIRE_UPSTREAM").as_deref() == Ok("1") {
        return Trial::test(name, move || {
            Err(format!(
                "{name}: the upstream engine is required but not installed; run \
                 scripts/install-test-deps.sh (or set MOONCAKE_UPSTREAM_PYTHON)"
            )
            .into())
        });
    }
    eprintln!(
        "skipped {name}: upstream Mooncake not installed (run scripts/install-test-deps.sh; \
         the full test command does)"
    );
    test.with_ignored_flag(true)
}

impl PeerProc {
    pub fn spawn(kind: Kind, size: usize, seed: u64) -> Self {
        Self::spawn_with(kind, size, seed, &[])
    }

    pub fn spawn_with(kind: Kind, size: usize, seed: u64, extra: &[&str]) -> Self {
        Self::spawn_as(kind, size, seed, extra, None)
    }

    /// Like `spawn_with`, as user `uid` when given (needs root).
    pub fn spawn_as(kind: Kind, size: usize, seed: u64, extra: &[&str], uid: Option<u32>) -> Self {
        let mut cmd = match kind {
            Kind::Ours => Command::new(env!("CARGO_BIN_EXE_mooncake-peer")),
            Kind::Upstream => {
                let mut c = Command::new(upstream_python().expect("upstream python"));
                c.arg(
                    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                        .join("tests/interop/upstream_peer.py"),
                );
                // Upstream's glog chatter is noise in test output.
                c.env("GLOG_minloglevel", "2");
                // With a metadata store upstream publishes this address
                // (else its first non-loopback one): nothing leaves the host.
                c.env("MC_TCP_BIND_ADDRESS", "127.0.0.1");
                c
            }
        };
        cmd.args(["--size", &size.to_string(), "--seed", &seed.to_string()])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(uid) = uid {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(uid);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning the {kind:?} peer: {e}"));
        let stdin = child.stdin.take().unwrap();
        let stdout: ChildStdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let first = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("{kind:?} peer did not start"));
        let json = first
            .strip_prefix("READY ")
            .unwrap_or_else(|| panic!("{kind:?} peer failed: {first}"));
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        Self {
            kind,
            segment: v["segment"].as_str().unwrap().to_string(),
            addr: v["addr"].as_u64().unwrap(),
            len: v["len"].as_u64().unwrap() as usize,
            child,
            stdin,
            lines: rx,
        }
    }

    /// Sends one command; Ok(detail) for "OK", Err(reason) for "ERR".
    pub fn cmd(&mut self, line: &str) -> Result<String, String> {
        writeln!(self.stdin, "{line}").expect("peer stdin");
        self.stdin.flush().unwrap();
        let reply = self
            .lines
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("{:?} peer gave no answer to {line:?}", self.kind));
        if reply == "OK" {
            Ok(String::new())
        } else if let Some(d) = reply.strip_prefix("OK ") {
            Ok(d.to_string())
        } else if let Some(e) = reply.strip_prefix("ERR ") {
            Err(e.to_string())
        } else {
            panic!("unexpected reply {reply:?} to {line:?}")
        }
    }

    /// Like `cmd`, panicking on ERR.
    pub fn ok(&mut self, line: &str) -> String {
        self.cmd(line)
            .unwrap_or_else(|e| panic!("{:?} peer: {line:?} failed: {e}", self.kind))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Ends the process at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PeerProc {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        for _ in 0..50 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }
}

/// The same scenario for any (initiator, target) pair: READ and WRITE of
/// several sizes, batches, a notify, a probe, and out-of-range requests that
/// must fail cleanly without stopping either side.
pub fn cross_scenario(init: &mut PeerProc, target: &mut PeerProc, target_seed: u64) {
    let seg = target.segment.clone();
    let base = target.addr;
    let tlen = target.len as u64;
    let who = format!("{:?} -> {:?}", init.kind, target.kind);

    // READ: the initiator's buffer gets the target's pattern.
    for len in [1usize, 4096, 65_537, (1 << 20) + 3, 4 << 20] {
        let roff = 123u64;
        init.ok(&format!("fill 0 {} 99", len + 1));
        init.ok(&format!("read {seg} {} 0 {len}", base + roff));
        init.cmd(&format!("check 0 {len} {target_seed} {roff}"))
            .unwrap_or_else(|e| panic!("{who}: READ of {len} bytes: {e}"));
        init.cmd(&format!("check {len} 1 99 {len}"))
            .unwrap_or_else(|e| panic!("{who}: READ of {len} wrote past its end: {e}"));
    }
    // WRITE: the target's buffer gets the initiator's pattern.
    for len in [1usize, 4096, 65_537, (1 << 20) + 3, 4 << 20] {
        let roff = 777usize;
        init.ok(&format!("fill 0 {len} 42"));
        init.ok(&format!("write {seg} {} 0 {len}", base + roff as u64));
        target
            .cmd(&format!("check {roff} {len} 42 0"))
            .unwrap_or_else(|e| panic!("{who}: WRITE of {len} bytes: {e}"));
        target
            .cmd(&format!(
                "check {} 1 {target_seed} {}",
                roff + len,
                roff + len
            ))
            .unwrap_or_else(|e| panic!("{who}: WRITE of {len} wrote past its end: {e}"));
        target.ok(&format!("fill {roff} {len} {target_seed}"));
    }
    // Batches.
    init.ok("fill 0 262144 5");
    init.ok(&format!("readv {seg} {} 0 4096 64", base));
    init.cmd(&format!("check 0 262144 {target_seed} 0"))
        .unwrap_or_else(|e| panic!("{who}: batch READ: {e}"));
    init.ok("fill 0 262144 6");
    init.ok(&format!("writev {seg} {} 0 8192 32", base + 8192));
    target
        .cmd("check 8192 262144 6 0")
        .unwrap_or_else(|e| panic!("{who}: batch WRITE: {e}"));
    target.ok(&format!("fill 8192 262144 {target_seed}"));
    // Notify after a write, probe.
    init.ok(&format!(
        "write_notify {seg} {} 0 64 init-req-7 kv-ready",
        base
    ));
    let notes = target.ok("notifs");
    assert!(
        notes.contains("\"init-req-7\"") && notes.contains("\"kv-ready\""),
        "{who}: notifs {notes}"
    );
    target.ok(&format!("fill 0 64 {target_seed}"));
    init.ok(&format!("probe {seg}"));
    // Out-of-range requests fail on the initiator; both sides keep serving.
    assert!(
        init.cmd(&format!("read {seg} {} 0 16", base + tlen - 8))
            .is_err(),
        "{who}: READ past the end succeeded"
    );
    assert!(
        init.cmd(&format!("write {seg} {} 0 16", base + tlen - 8))
            .is_err(),
        "{who}: WRITE past the end succeeded"
    );
    assert!(
        init.cmd(&format!("read {seg} 4096 0 16")).is_err(),
        "{who}: READ of an arbitrary address succeeded"
    );
    target
        .cmd(&format!("check {} 8 {target_seed} {}", tlen - 8, tlen - 8))
        .unwrap_or_else(|e| panic!("{who}: rejected WRITE changed memory: {e}"));
    init.ok(&format!("read {seg} {} 0 4096", base));
    init.cmd(&format!("check 0 4096 {target_seed} 0"))
        .unwrap_or_else(|e| panic!("{who}: after rejections: {e}"));
}
