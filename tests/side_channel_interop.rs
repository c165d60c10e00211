//! Our connector against a vLLM-style worker written in Python: pyzmq for
//! the side channel, msgspec structs with vLLM's field names and defaults,
//! and upstream Mooncake 0.3.13 as its transfer engine. KV moves for real
//! in both directions and both sides check the bytes.
//!
//! Whether the upstream engine is installed is known only at run time, so
//! this file has its own `main` (libtest-mimic): without it these tests are
//! reported as *ignored*, not passed (see `support::upstream_trial`).
mod pd;
mod support;

use std::future::Future;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use mooncake_connector::connector::bootstrap::BootstrapServer;
use mooncake_connector::connector::ProducerEvent;
use mooncake_connector::sim::model::tokenize;
use pd::{env, req, spec, Decode, Prefill};
use serde_json::Value;
use support::upstream_trial;

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let tests = vec![
        upstream_trial("vllm_style_decoder_pulls_from_our_prefill", || {
            block_on(vllm_style_decoder_pulls_from_our_prefill())
        }),
        upstream_trial("our_decoder_pulls_from_a_vllm_style_prefill", || {
            block_on(our_decoder_pulls_from_a_vllm_style_prefill())
        }),
    ];
    libtest_mimic::run(&args, tests).exit();
}

/// Runs `f` on a fresh two-thread runtime, as `#[tokio::test(flavor =
/// "multi_thread", worker_threads = 2)]` would.
fn block_on(f: impl Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(f)
}

fn python_peer(args: &[&str]) -> (std::process::Child, std::sync::mpsc::Receiver<Value>) {
    let py = support::upstream_python().unwrap();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/vllm_side_peer.py");
    let s = spec();
    let geometry = [
        "--layers".to_string(),
        s.layers.to_string(),
        "--heads".into(),
        s.heads.to_string(),
        "--head-size".into(),
        s.head_size.to_string(),
        "--block-size".into(),
        s.block_size.to_string(),
        "--num-blocks".into(),
        s.num_blocks.to_string(),
    ];
    let mut child = Command::new(py)
        .arg(script)
        .args(args)
        .args(&geometry)
        .env("GLOG_minloglevel", "2")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                let _ = tx.send(v);
            }
        }
    });
    (child, rx)
}

async fn vllm_style_decoder_pulls_from_our_prefill() {
    let mut p = Prefill::start(1, spec(), env(30)).await;
    let prompt = "a vLLM decoder pulling from mooncake-rs";
    let tokens = tokenize(prompt);
    let blocks: Vec<u64> = (0..spec().blocks_for(tokens.len()) as u64).collect();
    p.prefill("xfer-py-d", "p-py", &tokens, &blocks);
    let dst: Vec<String> = blocks.iter().map(|b| (b + 10).to_string()).collect();
    let (mut child, rx) = python_peer(&[
        "decoder",
        "--bootstrap",
        &p.bootstrap_url(),
        "--engine-id",
        &p.engine_id,
        "--transfer-id",
        "xfer-py-d",
        "--prompt",
        prompt,
        "--blocks",
        &dst.join(","),
    ]);
    let result = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("python decoder result");
    let _ = child.wait();
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["verified"], true, "{result}");
    assert_eq!(result["replies"][0]["status"], 0, "{result}");
    assert!(matches!(
        p.next_event(Duration::from_secs(5)).await,
        Some(ProducerEvent::FinishedSending { .. })
    ));
}

async fn our_decoder_pulls_from_a_vllm_style_prefill() {
    let bootstrap = BootstrapServer::start("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let prompt = "mooncake-rs decoding what a vLLM prefiller wrote";
    let tokens = tokenize(prompt);
    let src: Vec<String> = (0..spec().blocks_for(tokens.len()))
        .map(|b| (b + 3).to_string())
        .collect();
    let (mut child, rx) = python_peer(&[
        "prefill",
        "--bootstrap",
        &bootstrap.url(),
        "--engine-id",
        "vllm-prefill-0",
        "--transfer-id",
        "xfer-py-p",
        "--prompt",
        prompt,
        "--blocks",
        &src.join(","),
    ]);
    let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
    let r2 = rx.clone();
    let ready = tokio::task::spawn_blocking(move || {
        r2.lock().unwrap().recv_timeout(Duration::from_secs(60))
    })
    .await
    .unwrap()
    .expect("ready");
    assert!(
        ready["ready"]
            .as_str()
            .unwrap()
            .starts_with("tcp://127.0.0.1:"),
        "{ready}"
    );
    let d = Decode::start(1, spec(), env(30));
    let dst: Vec<u64> = (0..src.len() as u64).map(|b| b + 30).collect();
    let out = d
        .pull(
            &bootstrap.url(),
            "vllm-prefill-0",
            vec![req("d-py", "xfer-py-p", &dst)],
        )
        .await;
    assert_eq!(out[0].ok, ["d-py"], "{out:?}");
    d.verify(&tokens, &dst).unwrap();
    let done = tokio::task::spawn_blocking(move || {
        rx.lock().unwrap().recv_timeout(Duration::from_secs(30))
    })
    .await
    .unwrap()
    .expect("summary");
    let _ = child.wait();
    assert_eq!(done["rc"], 0, "{done}");
    // The prefiller saw our layer names and TP facts.
    assert_eq!(done["names"][0], "model.layers.0.self_attn.attn", "{done}");
    assert_eq!(done["tp"], serde_json::json!([1, 0]));
}
