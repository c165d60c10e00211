//! The simulated prefill and decode engines (real engines on 127.0.0.1,
//! real bootstrap server and side channel, OpenAI-style HTTP) in the
//! parallel layouts vLLM runs: pipeline parallel on either side, MLA and
//! replicated KV with heterogeneous TP, and a hybrid model with two
//! KV-cache groups and a layer sharing another's storage. Every decode
//! checks every received KV byte per layer and head (`kv_check::verify_kv`)
//! and answers from a digest of it, so a wrong or missing byte fails the
//! request or changes its text; the prefiller must free every block
//! afterwards (each worker counted its pulls).
mod pd;

use pd::Served;

use std::time::Duration;

use mooncake_connector::connector::{ConnectorEnv, KvTransferConfig};
use mooncake_connector::sim::engine::SimEngineConfig;
use mooncake_connector::sim::model::{expected_completion, ModelSpec};
use mooncake_connector::sim::server::response_text;
use serde_json::{json, Value};

/// A model of `layers` layers and `heads` KV heads, small blocks.
fn model(layers: usize, heads: usize) -> ModelSpec {
    ModelSpec {
        layers,
        heads,
        head_size: 8,
        block_size: 4,
        num_blocks: 128,
        ..ModelSpec::default()
    }
}

async fn serve(role: &str, spec: ModelSpec, tp: usize, pp: usize) -> Served {
    let kv = KvTransferConfig::from_json(&format!(
        r#"{{"kv_connector":"MooncakeConnector","kv_role":"{role}","kv_connector_extra_config":{{"mooncake_protocol":"tcp"}}}}"#
    ))
    .unwrap();
    let env = ConnectorEnv {
        bootstrap_port: 0,
        ..pd::env(30)
    };
    let cfg = SimEngineConfig {
        kv,
        env,
        spec,
        tp,
        pp,
        dp_rank: 0,
        model_name: "sim".into(),
        max_num_seqs: 8,
        prefill_time_per_token: Duration::ZERO,
        remote_decode_block_budget: spec.num_blocks * spec.groups(),
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

async fn metrics(s: &Served) -> Value {
    reqwest::get(format!("{}/metrics", s.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Prefill (P: TP `p.1`, PP `p.2`) and decode (D: TP `d.1`, PP `d.2`) of
/// the same model; three prompts of different lengths, the decode leg sent
/// at the same time as the prefill leg (as vLLM's proxy does), every answer
/// checked, then the prefiller's blocks all free again.
async fn run_pair(spec: ModelSpec, p: (usize, usize), d: (usize, usize)) {
    let pe = serve("kv_producer", spec, p.0, p.1).await;
    let de = serve("kv_consumer", spec, d.0, d.1).await;
    let prompts = [
        "a",
        "a prompt of a few blocks",
        "a longer prompt that spans many more blocks of the cache than the others do, \
         so block lists are long and runs of consecutive blocks appear",
    ];
    for (i, prompt) in prompts.iter().enumerate() {
        let tid = format!("xfer-{i}");
        let prefill = json!({"prompt": prompt, "max_tokens": 1, "stream": false,
            "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false, "transfer_id": tid}});
        let decode = json!({"prompt": prompt, "max_tokens": 12,
            "kv_transfer_params": {"do_remote_decode": false, "do_remote_prefill": true, "transfer_id": tid,
                "remote_engine_id": pe.engine.config().kv.engine_id,
                "remote_bootstrap_addr": pe.engine.bootstrap_url().unwrap()}});
        let (pr, dr) = tokio::join!(post(&pe.url, prefill), post(&de.url, decode));
        assert_eq!(pr.0, 200, "prefill leg: {}", pr.1);
        assert_eq!(dr.0, 200, "decode leg: {}", dr.1);
        assert!(dr.1.contains("\"kv_source\":\"remote\""), "{}", dr.1);
        assert_eq!(
            response_text(&dr.1).unwrap(),
            expected_completion(&spec, prompt, 12),
            "prompt {i}"
        );
    }
    let mut m = metrics(&pe).await;
    for _ in 0..100 {
        if m["requests_holding_kv"] == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        m = metrics(&pe).await;
    }
    assert_eq!(m["requests_holding_kv"], 0, "{m}");
    assert_eq!(m["blocks_free"], m["blocks_total"], "{m}");
    assert_eq!(m["connector"]["transfers_failed"], 0, "{m}");
    let dm = metrics(&de).await;
    assert_eq!(dm["connector"]["pulls_failed"], 0, "{dm}");
    // Every byte moved once: replicas and shared storage are not sent
    // twice, and nothing the decoder counts is missing.
    assert_eq!(
        m["connector"]["bytes_sent"], dm["connector"]["bytes_received"],
        "prefill {m}\ndecode {dm}"
    );
    assert_eq!(dm["blocks_free"], dm["blocks_total"], "{dm}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pp_1_to_1_with_pp_2_on_both_sides() {
    run_pair(model(4, 2), (1, 2), (1, 2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pp_2_prefill_to_pp_1_decode() {
    run_pair(model(5, 2), (1, 2), (1, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pp_1_prefill_to_pp_2_decode() {
    run_pair(model(5, 2), (1, 1), (1, 2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pp_2_tp_2_prefill_to_pp_1_tp_1_decode() {
    run_pair(model(4, 4), (2, 2), (1, 1)).await;
}

fn mla() -> ModelSpec {
    ModelSpec {
        mla: true,
        head_size: 36,
        ..model(3, 1)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mla_tp_2_to_1() {
    run_pair(mla(), (2, 1), (1, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mla_tp_1_to_2() {
    run_pair(mla(), (1, 1), (2, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mla_tp_2_to_4_and_4_to_2() {
    run_pair(mla(), (2, 1), (4, 1)).await;
    run_pair(mla(), (4, 1), (2, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_kv_tp_4_to_2() {
    // Two KV heads: TP 4 holds each head twice.
    run_pair(model(2, 2), (4, 1), (2, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_kv_tp_2_to_4_1_to_2_and_2_to_1() {
    run_pair(model(2, 2), (2, 1), (4, 1)).await;
    // One KV head on TP 2: both decode ranks hold it; and back, where one
    // prefill rank of the two sends it.
    run_pair(model(2, 1), (1, 1), (2, 1)).await;
    run_pair(model(2, 1), (2, 1), (1, 1)).await;
}

fn hybrid() -> ModelSpec {
    ModelSpec {
        hybrid: true,
        ..model(4, 2)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_two_groups_with_shared_storage() {
    let s = hybrid();
    assert_eq!(s.groups(), 2);
    assert_eq!(s.source_layer(3), 1, "layer 3 reuses layer 1's storage");
    run_pair(s, (1, 1), (1, 1)).await;
    run_pair(s, (2, 1), (1, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_with_pp_2_to_1() {
    // The shared layer (3) and its source (1) land in different stages:
    // stage 1 keeps its own copy.
    run_pair(hybrid(), (1, 2), (1, 1)).await;
}
