//! The example engines over HTTP, in-process on random ports: request
//! lifecycle cases that need the serving layer (client aborts, the load
//! failure policy, malformed kv_transfer_params).
mod pd;

use pd::Served;

use std::time::{Duration, Instant};

use mooncake_connector::connector::{ConnectorEnv, KvTransferConfig};
use mooncake_connector::sim::engine::SimEngineConfig;
use mooncake_connector::sim::model::{expected_completion, ModelSpec};
use mooncake_connector::sim::server::response_text;
use serde_json::{json, Value};

fn spec() -> ModelSpec {
    ModelSpec {
        layers: 2,
        heads: 2,
        head_size: 8,
        block_size: 8,
        num_blocks: 256,
        ..ModelSpec::default()
    }
}

async fn serve(
    role: &str,
    extra: &str,
    abort_secs: u64,
    max_num_seqs: usize,
    us_per_token: u64,
) -> Served {
    let kv = KvTransferConfig::from_json(&format!(
        r#"{{"kv_connector":"MooncakeConnector","kv_role":"{role}","kv_connector_extra_config":{{"mooncake_protocol":"tcp"}}{extra}}}"#
    ))
    .unwrap();
    let env = ConnectorEnv {
        bootstrap_port: 0,
        ..pd::env(abort_secs)
    };
    let cfg = SimEngineConfig {
        kv,
        env,
        spec: spec(),
        tp: 1,
        pp: 1,
        dp_rank: 0,
        model_name: "sim".into(),
        max_num_seqs,
        prefill_time_per_token: Duration::from_micros(us_per_token),
        remote_decode_block_budget: spec().num_blocks / 2,
    };
    pd::serve_engine(cfg).await
}

async fn post(url: &str, body: Value) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn prefill_leg(prompt: &str, tid: &str) -> Value {
    json!({"prompt": prompt, "max_tokens": 1, "stream": false,
           "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false, "transfer_id": tid}})
}

fn decode_leg(p: &Served, prompt: &str, tid: &str, max_tokens: usize) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens,
           "kv_transfer_params": {"do_remote_decode": false, "do_remote_prefill": true, "transfer_id": tid,
                                  "remote_engine_id": p.engine.config().kv.engine_id,
                                  "remote_bootstrap_addr": p.engine.bootstrap_url().unwrap()}})
}

async fn metric(s: &Served, key: &str) -> u64 {
    let v: Value = reqwest::get(format!("{}/metrics", s.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v[key]
        .as_u64()
        .or_else(|| v["connector"][key].as_u64())
        .unwrap_or_else(|| panic!("no metric {key} in {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn happy_path_both_orders() {
    let p = serve("kv_producer", "", 30, 8, 0).await;
    let d = serve("kv_consumer", "", 30, 8, 0).await;
    let prompt = "the prefill leg first, then the decode leg";
    let (code, _) = post(&p.url, prefill_leg(prompt, "xfer-1")).await;
    assert_eq!(code, 200);
    let (code, body) = post(&d.url, decode_leg(&p, prompt, "xfer-1", 12)).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        response_text(&body).unwrap(),
        expected_completion(&spec(), prompt, 12)
    );
    assert!(body.contains("\"kv_source\":\"remote\""), "{body}");
    // Decode leg first (the proxy sends both at once).
    let prompt2 = "decode arrives before the prefill is done";
    let dreq = tokio::spawn({
        let v = decode_leg(&p, prompt2, "xfer-2", 5);
        let url = d.url.clone();
        async move { post(&url, v).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    post(&p.url, prefill_leg(prompt2, "xfer-2")).await;
    let (code, body) = dreq.await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        response_text(&body).unwrap(),
        expected_completion(&spec(), prompt2, 5)
    );
    for _ in 0..50 {
        if metric(&p, "requests_holding_kv").await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metric(&p, "requests_holding_kv").await, 0);
    assert_eq!(metric(&p, "blocks_free").await, spec().num_blocks as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_client_abort_releases_kv_and_fails_the_decode() {
    // 2 ms per token: a 400-token prefill takes ~0.8 s; the client gives up
    // after 100 ms.
    let p = serve("kv_producer", "", 30, 8, 2000).await;
    let d = serve("kv_consumer", "", 30, 8, 0).await;
    let prompt = "x".repeat(400);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", p.url))
        .timeout(Duration::from_millis(100))
        .json(&prefill_leg(&prompt, "xfer-ab"))
        .send()
        .await;
    assert!(r.is_err(), "the client was meant to time out");
    for _ in 0..100 {
        if metric(&p, "aborted_prefills").await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metric(&p, "aborted_prefills").await, 1);
    assert_eq!(metric(&p, "blocks_free").await, spec().num_blocks as u64);
    let t0 = Instant::now();
    let (code, body) = post(&d.url, decode_leg(&p, &prompt, "xfer-ab", 4)).await;
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("aborted"), "{body}");
    assert!(t0.elapsed() < Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_client_abort_before_scheduling_releases_prefill_kv() {
    let p = serve("kv_producer", "", 30, 8, 0).await;
    // One sequence at a time: the second request waits unscheduled.
    let d = serve("kv_consumer", "", 30, 1, 0).await;
    // Request 1 occupies the decoder while its prefill has not happened.
    let first = tokio::spawn({
        let (v, url) = (decode_leg(&p, "first request", "xfer-f", 3), d.url.clone());
        async move { post(&url, v).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Request 2's prefill is done; its decode leg waits for a slot, and its
    // client leaves.
    post(&p.url, prefill_leg("second request", "xfer-s")).await;
    assert_eq!(metric(&p, "requests_holding_kv").await, 1);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", d.url))
        .timeout(Duration::from_millis(200))
        .json(&decode_leg(&p, "second request", "xfer-s", 3))
        .send()
        .await;
    assert!(r.is_err());
    // The empty pull released request 2's blocks on the prefiller.
    for _ in 0..100 {
        if metric(&p, "released_slots").await == 1 && metric(&p, "requests_holding_kv").await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metric(&p, "released_slots").await, 1);
    assert_eq!(metric(&p, "requests_holding_kv").await, 0);
    assert_eq!(metric(&d, "released_decodes").await, 1);
    // Request 1 completes once its prefill arrives.
    post(&p.url, prefill_leg("first request", "xfer-f")).await;
    let (code, body) = first.await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        response_text(&body).unwrap(),
        expected_completion(&spec(), "first request", 3)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recompute_policy_and_malformed_params() {
    let p = serve("kv_producer", "", 30, 8, 0).await;
    let d = serve(
        "kv_consumer",
        r#","kv_load_failure_policy":"recompute""#,
        30,
        8,
        0,
    )
    .await;
    // Unknown engine: the transfer fails, the decoder recomputes, and the
    // answer is still right.
    let mut v = decode_leg(&p, "recompute me", "xfer-rc", 6);
    v["kv_transfer_params"]["remote_engine_id"] = json!("nope");
    let (code, body) = post(&d.url, v).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"kv_source\":\"recomputed\""), "{body}");
    assert_eq!(
        response_text(&body).unwrap(),
        expected_completion(&spec(), "recompute me", 6)
    );
    // Missing fields: logged, run without a transfer.
    let (code, body) = post(
        &d.url,
        json!({"prompt": "no params", "max_tokens": 2,
        "kv_transfer_params": {"do_remote_prefill": true, "transfer_id": "t"}}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"kv_source\":\"local\""), "{body}");
    // A prefill leg without transfer_id holds no KV.
    let (code, _) = post(&p.url, json!({"prompt": "no id", "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": true}})).await;
    assert_eq!(code, 200);
    assert_eq!(metric(&p, "requests_holding_kv").await, 0);
    // Bad bodies are 400s with a reason.
    let (code, body) = post(&d.url, json!({"prompt": 5})).await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = post(&d.url, json!({"prompt": "x", "max_tokens": -1})).await;
    assert!(code == 400 && body.contains("max_tokens"), "{body}");
    let (code, body) = post(&d.url, json!({"prompt": "x".repeat(100_000)})).await;
    assert!(code == 400 && body.contains("KV blocks"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_both_engine_sends_to_itself() {
    let both = serve("kv_both", "", 30, 8, 0).await;
    let prompt = "one engine, both roles";
    let (code, _) = post(&both.url, prefill_leg(prompt, "xfer-both")).await;
    assert_eq!(code, 200);
    let (code, body) = post(&both.url, decode_leg(&both, prompt, "xfer-both", 9)).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"kv_source\":\"remote\""), "{body}");
    assert_eq!(
        response_text(&body).unwrap(),
        expected_completion(&spec(), prompt, 9)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_name_and_peermem_reach_the_engine() {
    use mooncake_connector::connector::{build_engine, KvTransferConfig};
    let kv = KvTransferConfig::from_json(
        r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_producer","kv_connector_extra_config":{"device_name":"mlx5_0,mlx5_2"}}"#,
    )
    .unwrap();
    let engine = build_engine(&kv, &pd::env(30)).unwrap();
    assert_eq!(engine.device_filters().unwrap().0, ["mlx5_0", "mlx5_2"]);
    // WITH_NVIDIA_PEERMEM is the engine's own default (not overridden).
    if std::env::var_os("WITH_NVIDIA_PEERMEM").is_none() {
        assert_eq!(
            engine.gpu_registration().unwrap(),
            mooncake::GpuRegistration::PeerMem
        );
    }
    assert!(engine.segment_name().starts_with("127.0.0.1:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_bootstrap_server_is_a_bounded_503_naming_it() {
    // Accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let d = serve("kv_consumer", "", 30, 8, 0).await;
    let body = json!({"prompt": "nobody answers the bootstrap query", "max_tokens": 3,
        "kv_transfer_params": {"do_remote_decode": false, "do_remote_prefill": true, "transfer_id": "xfer-s",
                               "remote_engine_id": "e", "remote_bootstrap_addr": format!("http://{silent_addr}")}});
    let t0 = Instant::now();
    let (code, text) = post(&d.url, body).await;
    let took = t0.elapsed();
    assert_eq!(code, 503, "{text}");
    assert!(text.contains(&silent_addr.to_string()), "{text}");
    // The default bound is 10 s (MOONCAKE_BOOTSTRAP_QUERY_TIMEOUT).
    assert!(took < Duration::from_secs(13), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_decode_holds_are_budgeted_and_visible() {
    // Budget: half of 256 blocks. Each prompt below needs 50 blocks.
    let p = serve("kv_producer", "", 30, 8, 0).await;
    let prompt = "x ".repeat(200);
    let need = spec().blocks_for(mooncake_connector::sim::model::tokenize(&prompt).len());
    assert!((43..=64).contains(&need), "{need}");
    let held = 128 / need;
    for i in 0..held {
        let (code, body) = post(&p.url, prefill_leg(&prompt, &format!("xfer-h{i}"))).await;
        assert_eq!(code, 200, "{body}");
    }
    let (code, body) = post(&p.url, prefill_leg(&prompt, "xfer-over")).await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("remote-decode-block-budget"), "{body}");
    // The stats show what is held and for how long.
    let m: Value = reqwest::get(format!("{}/metrics", p.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(m["remote_decode_blocks_held"], held * need, "{m}");
    assert_eq!(m["remote_decode_budget_refusals"], 1, "{m}");
    assert_eq!(
        m["held_kv"]["requests"].as_array().unwrap().len(),
        held,
        "{m}"
    );
    assert!(m["held_kv"]["oldest_age_s"].as_f64().unwrap() > 0.0, "{m}");
    // Local work is not starved: the scheduler still has blocks.
    let (code, body) = post(&p.url, json!({"prompt": prompt, "max_tokens": 2})).await;
    assert_eq!(code, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_pull_frees_both_sides_at_once() {
    // A slow prefill: 400 prompt bytes at 5 ms each.
    let p = serve("kv_producer", "", 30, 8, 5_000).await;
    let d = serve("kv_consumer", "", 30, 8, 0).await;
    let prompt = "y ".repeat(200);
    let t0 = Instant::now();
    let prefill = tokio::spawn({
        let (url, v) = (p.url.clone(), prefill_leg(&prompt, "xfer-gone"));
        async move { post(&url, v).await }
    });
    // The decode leg's client gives up while the decoder waits for the KV.
    let gave_up = reqwest::Client::new()
        .post(format!("{}/v1/completions", d.url))
        .timeout(Duration::from_millis(500))
        .json(&decode_leg(&p, &prompt, "xfer-gone", 4))
        .send()
        .await;
    assert!(gave_up.is_err());
    // The decoder frees its blocks without waiting for the prefill.
    let mut freed = false;
    while t0.elapsed() < Duration::from_millis(1500) {
        if metric(&d, "blocks_free").await == metric(&d, "blocks_total").await {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(freed, "decoder still holds blocks at {:?}", t0.elapsed());
    assert_eq!(metric(&d, "released_decodes").await, 1);
    // The prefill finishes; its blocks go at once, not after the abort
    // timeout.
    let (code, _) = prefill.await.unwrap();
    assert_eq!(code, 200);
    let t1 = Instant::now();
    while metric(&p, "requests_holding_kv").await != 0 {
        assert!(
            t1.elapsed() < Duration::from_secs(2),
            "prefill still holds KV"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(metric(&p, "remote_decode_blocks_held").await, 0);
    assert_eq!(
        metric(&p, "bytes_sent").await,
        0,
        "nothing written into freed blocks"
    );
}
