//! The connector with `mooncake_protocol: "rdma"` over softverbs, the
//! software verbs stand-in (vendor/softverbs, built with `make` into
//! Cargo's temporary directory): the KV really travels over RDMA on the
//! NICs `device_name` allows, and without a verbs library the same setting
//! falls back to TCP and still moves the KV. One `#[test]`, because the
//! verbs environment (`MC_VERBS_LIBRARY`, `MC_SOFTVERBS_DEVICES`) is
//! process-wide.
mod pd;
#[path = "../mooncake/tests/softverbs/mod.rs"]
mod softverbs;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooncake::LinkLayer;
use mooncake_connector::connector::ProducerEvent;
use mooncake_connector::sim::model::{expected_digest, tokenize};
use pd::{all_ok, env, req, spec, Decode, Prefill};

/// Log lines, captured so the test can check the fallback warning.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn take(&self) -> String {
        String::from_utf8(std::mem::take(&mut *self.0.lock().unwrap())).unwrap()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

fn rdma_extra(device_name: &str) -> String {
    format!(r#"{{"mooncake_protocol":"rdma","device_name":"{device_name}","num_workers":2}}"#)
}

/// One prefill → decode transfer of `text` into decode blocks starting at
/// `dst0`; returns the bytes the prefiller sent.
async fn transfer(p: &mut Prefill, d: &Decode, id: &str, text: &str, dst0: u64) -> u64 {
    let tokens = tokenize(text);
    let n = spec().blocks_for(tokens.len()) as u64;
    let src: Vec<u64> = (0..n).collect();
    let dst: Vec<u64> = (dst0..dst0 + n).collect();
    let before = p.stats.snapshot().bytes_sent;
    p.prefill(&format!("xfer-{id}"), &format!("p-{id}"), &tokens, &src);
    let out = d
        .pull(
            &p.bootstrap_url(),
            &p.engine_id,
            vec![req(&format!("d-{id}"), &format!("xfer-{id}"), &dst)],
        )
        .await;
    all_ok(&out, &[&format!("d-{id}")]);
    assert_eq!(
        d.verify(&tokens, &dst).unwrap(),
        expected_digest(&spec(), &tokens)
    );
    assert!(matches!(
        p.next_event(Duration::from_secs(5)).await,
        Some(ProducerEvent::FinishedSending { .. })
    ));
    let sent = p.stats.snapshot().bytes_sent - before;
    assert!(sent > 0);
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_setting_uses_rdma_on_allowed_nics_else_falls_back_to_tcp() {
    let logs = Logs::default();
    tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .init();
    let lib = softverbs::build_softverbs();
    std::env::set_var(
        "MC_SOFTVERBS_DEVICES",
        "sv0:roce:numa=0,sv1:roce:numa=1,sv2:roce:numa=0,sv3:ib:numa=1",
    );
    std::env::remove_var("MC_FORCE_TCP");
    std::env::remove_var("MC_FORCE_HCA");

    // 1. No verbs library: "rdma" falls back to TCP, and the KV still moves.
    std::env::set_var("MC_VERBS_LIBRARY", "/nonexistent/libibverbs.so.1");
    rdma_without_verbs_falls_back_to_tcp(&logs).await;

    // 2. softverbs: RDMA on the NICs device_name allows, and only on them.
    std::env::set_var("MC_VERBS_LIBRARY", &lib);
    rdma_over_softverbs_uses_only_allowed_nics(&logs).await;
}

/// Phase 1: no verbs library (MC_VERBS_LIBRARY names a missing file).
async fn rdma_without_verbs_falls_back_to_tcp(logs: &Logs) {
    let mut p = Prefill::start_with(1, spec(), env(30), &rdma_extra("")).await;
    let d = Decode::start_with(1, spec(), env(30), &rdma_extra(""));
    for e in [&p.ctx(0).engine, &d.ranks[0].0.engine] {
        assert!(!e.has_rdma());
        let why = e.rdma_unavailable_reason().expect("a fallback reason");
        assert!(why.contains("/nonexistent"), "{why}");
        assert!(e.rdma_topology().is_err());
    }
    // One warning per worker engine, naming the setting and the cause.
    let warned = logs.take();
    let lines: Vec<&str> = warned
        .lines()
        .filter(|l| l.contains("falling back to TCP"))
        .collect();
    assert_eq!(lines.len(), 2, "{warned}");
    for l in lines {
        assert!(
            l.contains("WARN")
                && l.contains("mooncake_protocol \"rdma\"")
                && l.contains("/nonexistent"),
            "{l}"
        );
    }
    let sent = transfer(&mut p, &d, "tcp", "no verbs library, so TCP it is", 10).await;
    // TCP transport: payload on the socket, or moved by the same-host
    // path that rides on a TCP lane (both engines share this host).
    let c = p.ctx(0).engine.counters().unwrap();
    assert!(c.tcp_requests_sent + c.same_host_requests > 0, "{c:?}");
    assert!(sent > 0);
}

/// Phase 2: the softverbs library, four soft NICs, device_name allowing
/// two of them on the prefill side and one on the decode side.
async fn rdma_over_softverbs_uses_only_allowed_nics(logs: &Logs) {
    let mut p = Prefill::start_with(1, spec(), env(30), &rdma_extra("sv0,sv1")).await;
    let d = Decode::start_with(1, spec(), env(30), &rdma_extra("sv2"));
    let pe = p.ctx(0).engine.clone();
    let de = d.ranks[0].0.engine.clone();
    assert!(pe.has_rdma() && de.has_rdma());
    let warned = logs.take();
    assert!(!warned.contains("falling back"), "{warned}");
    assert_eq!(pe.rdma_unavailable_reason(), None);
    let topo = pe.rdma_topology().unwrap();
    let mut names = topo.device_names();
    names.sort();
    assert_eq!(names, ["sv0", "sv1"]);
    assert!(topo.devices.iter().all(|d| d.link_layer == LinkLayer::Roce));
    assert_eq!(de.rdma_topology().unwrap().device_names(), ["sv2"]);

    let before = pe.rdma_counters().unwrap();
    assert_eq!(before.total_bytes(), 0);
    let sent = transfer(
        &mut p,
        &d,
        "rdma",
        "prefill pushes these blocks over two soft RoCE ports into one",
        20,
    )
    .await;
    let moved = pe.rdma_counters().unwrap().since(&before);
    // Every byte went over RDMA, none over TCP, and only on the allowed
    // NICs the priority matrix prefers for where the KV cache lives (its
    // NUMA node: sv0 on node 0, sv1 on node 1).
    assert_eq!(moved.total_bytes(), sent, "{moved:?}");
    assert_eq!(moved.total_errors(), 0);
    let location = p.ctx(0).kv.location().unwrap();
    let preferred = topo.nics_for(&location).preferred;
    assert!(!preferred.is_empty(), "{location}: {topo:?}");
    for nic in &moved.nics {
        assert!(["sv0", "sv1"].contains(&nic.name.as_str()), "{moved:?}");
        if !preferred.contains(&nic.name) {
            assert_eq!(nic.bytes, 0, "{location} prefers {preferred:?}: {moved:?}");
        }
    }
    assert_eq!(moved.nics.len(), 2);
    let (pc, dc) = (pe.counters().unwrap(), de.counters().unwrap());
    assert_eq!(
        (pc.tcp_requests_sent, pc.same_host_requests),
        (0, 0),
        "{pc:?}"
    );
    assert_eq!(
        (dc.tcp_requests_served, dc.same_host_served),
        (0, 0),
        "{dc:?}"
    );
    // The decoder's NIC is only a target: it posted nothing itself.
    assert_eq!(de.rdma_counters().unwrap().total_work_requests(), 0);
}
