//! The serving front of the example engines and proxy, in-process on
//! 127.0.0.1 (ports chosen by binding port 0): `stream_options.include_usage`
//! as vLLM's OpenAI server answers it, `GET /v1/models` on the engines and
//! the proxy, and a client's readiness check against proxies with and
//! without `/health` and `/v1/models`.
mod pd;

use pd::Served;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::{get, post};
use axum::Router;
use mooncake_connector::connector::{ConnectorEnv, KvTransferConfig};
use mooncake_connector::sim::engine::SimEngineConfig;
use mooncake_connector::sim::model::{chat_prompt, expected_completion, ModelSpec};
use mooncake_connector::sim::proxy::{wait_ready, Proxy, ProxyConfig, ReadyBy, PROBE_PROMPT};
use mooncake_connector::sim::server::{response_text, stream_usage};
use serde_json::{json, Value};

fn spec() -> ModelSpec {
    ModelSpec {
        layers: 2,
        heads: 2,
        head_size: 8,
        block_size: 8,
        num_blocks: 128,
        ..ModelSpec::default()
    }
}

async fn serve(role: &str, model: &str) -> Served {
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
        spec: spec(),
        tp: 1,
        pp: 1,
        dp_rank: 0,
        model_name: model.into(),
        max_num_seqs: 8,
        prefill_time_per_token: Duration::ZERO,
        remote_decode_block_budget: spec().num_blocks / 2,
    };
    pd::serve_engine(cfg).await
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn post_to(url: &str, body: Value) -> (u16, String) {
    let r = http().post(url).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The JSON of every `data:` line before `[DONE]`.
fn chunks(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .take_while(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn include_usage_on_streamed_completions() {
    let d = serve("kv_consumer", "sim-a").await;
    let url = format!("{}/v1/completions", d.url);
    let prompt = "usage, please";
    let body = |opts: Value| {
        let mut b = json!({"model": "sim-a", "prompt": prompt, "max_tokens": 5, "stream": true});
        if !opts.is_null() {
            b["stream_options"] = opts;
        }
        b
    };
    // Asked for: one more chunk before [DONE], no choices, the whole usage.
    let (code, text) = post_to(&url, body(json!({"include_usage": true}))).await;
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        response_text(&text).unwrap(),
        expected_completion(&spec(), prompt, 5)
    );
    let cs = chunks(&text);
    let last = cs.last().unwrap();
    assert_eq!(last["choices"], json!([]), "{last}");
    assert_eq!(last["object"], "text_completion");
    assert_eq!(last["model"], "sim-a");
    assert_eq!(last["id"], cs[0]["id"]);
    assert_eq!(last["usage"], usage(prompt.len(), 5));
    assert_eq!(stream_usage(&text).unwrap(), Some(usage(prompt.len(), 5)));
    // Every other chunk carries "usage": null, as vLLM's completion chunks.
    for c in &cs[..cs.len() - 1] {
        assert_eq!(c.get("usage"), Some(&Value::Null), "{c}");
        assert_eq!(c["choices"].as_array().unwrap().len(), 1);
    }
    // vLLM's default: a stream_options object means include_usage.
    let (_, text) = post_to(&url, body(json!({}))).await;
    assert_eq!(stream_usage(&text).unwrap(), Some(usage(prompt.len(), 5)));
    // Not asked for: no usage chunk.
    for opts in [
        Value::Null,
        json!({"include_usage": false}),
        json!({"include_usage": null}),
    ] {
        let (code, text) = post_to(&url, body(opts.clone())).await;
        assert_eq!(code, 200, "{text}");
        assert_eq!(stream_usage(&text).unwrap(), None, "{opts}: {text}");
        assert_eq!(chunks(&text).len(), 6, "{opts}");
    }
    // continuous_usage_stats: the counts so far on every chunk too.
    let (_, text) = post_to(
        &url,
        body(json!({"include_usage": true, "continuous_usage_stats": true})),
    )
    .await;
    let cs = chunks(&text);
    for (i, c) in cs[..5].iter().enumerate() {
        assert_eq!(c["usage"], usage(prompt.len(), i + 1), "{c}");
    }
    assert_eq!(cs[5]["choices"][0]["finish_reason"], "length");
    assert_eq!(cs[6]["usage"], usage(prompt.len(), 5));
    // Refused as vLLM refuses them.
    let (code, text) = post_to(
        &url,
        json!({"prompt": prompt, "stream": false, "stream_options": {"include_usage": true}}),
    )
    .await;
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("stream=True"), "{text}");
    let (code, text) = post_to(
        &url,
        json!({"prompt": prompt, "stream": true, "stream_options": {"include_usage": "yes"}}),
    )
    .await;
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("include_usage"), "{text}");
    let (code, text) = post_to(
        &url,
        json!({"prompt": prompt, "stream": true, "stream_options": [true]}),
    )
    .await;
    assert_eq!(code, 400, "{text}");
    // A non-streamed request with an empty stream_options is fine (vLLM
    // lets an empty object through), and usage is in the body as always.
    let (code, text) = post_to(
        &url,
        json!({"prompt": prompt, "max_tokens": 3, "stream_options": {}}),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"], usage(prompt.len(), 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn include_usage_on_streamed_chat_completions() {
    let d = serve("kv_consumer", "sim-chat").await;
    let url = format!("{}/v1/chat/completions", d.url);
    let msgs = vec![("user".to_string(), "hello there".to_string())];
    let prompt = chat_prompt(&msgs);
    let body = json!({"model": "sim-chat", "messages": [{"role": "user", "content": "hello there"}],
                      "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true}});
    let (code, text) = post_to(&url, body.clone()).await;
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        response_text(&text).unwrap(),
        expected_completion(&spec(), &prompt, 4)
    );
    let cs = chunks(&text);
    // Role chunk, 4 content chunks, finish chunk, usage chunk.
    assert_eq!(cs.len(), 7, "{text}");
    let last = cs.last().unwrap();
    assert_eq!(last["object"], "chat.completion.chunk");
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"], usage(prompt.len(), 4));
    // vLLM leaves the usage key out of chat chunks that have none.
    for c in &cs[..cs.len() - 1] {
        assert!(c.get("usage").is_none(), "{c}");
    }
    let mut plain = body.clone();
    plain.as_object_mut().unwrap().remove("stream_options");
    let (_, text) = post_to(&url, plain).await;
    assert_eq!(stream_usage(&text).unwrap(), None);
    assert_eq!(chunks(&text).len(), 6);
    let mut cont = body;
    cont["stream_options"]["continuous_usage_stats"] = json!(true);
    let (_, text) = post_to(&url, cont).await;
    let cs = chunks(&text);
    assert_eq!(cs[0]["usage"], usage(prompt.len(), 0), "the role chunk");
    assert_eq!(cs[4]["usage"], usage(prompt.len(), 4));
    assert_eq!(cs[6]["usage"], usage(prompt.len(), 4));
}

/// The keys of vLLM's `ModelCard` and `ModelPermission`.
const CARD_KEYS: [&str; 8] = [
    "created",
    "id",
    "max_model_len",
    "object",
    "owned_by",
    "parent",
    "permission",
    "root",
];
const PERMISSION_KEYS: [&str; 12] = [
    "allow_create_engine",
    "allow_fine_tuning",
    "allow_logprobs",
    "allow_sampling",
    "allow_search_indices",
    "allow_view",
    "created",
    "group",
    "id",
    "is_blocking",
    "object",
    "organization",
];

fn sorted_keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

/// Checks `list` is vLLM's model list with one card for `name`.
fn check_model_list(list: &Value, name: &str) {
    assert_eq!(sorted_keys(list), ["data", "object"], "{list}");
    assert_eq!(list["object"], "list");
    let data = list["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "{list}");
    let card = &data[0];
    assert_eq!(sorted_keys(card), CARD_KEYS, "{card}");
    assert_eq!(card["id"], name);
    assert_eq!(card["object"], "model");
    assert_eq!(card["owned_by"], "vllm");
    assert_eq!(card["root"], name);
    assert_eq!(card["parent"], Value::Null);
    assert_eq!(card["max_model_len"], spec().num_blocks * spec().block_size);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        card["created"].as_u64().unwrap().abs_diff(now) < 60,
        "{card}"
    );
    let perms = card["permission"].as_array().unwrap();
    assert_eq!(perms.len(), 1);
    assert_eq!(sorted_keys(&perms[0]), PERMISSION_KEYS, "{}", perms[0]);
    assert_eq!(perms[0]["object"], "model_permission");
    assert!(perms[0]["id"].as_str().unwrap().starts_with("modelperm-"));
    assert_eq!(perms[0]["organization"], "*");
    assert_eq!(perms[0]["allow_sampling"], true);
    assert_eq!(perms[0]["allow_fine_tuning"], false);
}

async fn get_json(url: &str) -> (u16, Value) {
    let r = http().get(url).send().await.unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_on_prefill_and_decode_in_vllms_shape() {
    let p = serve("kv_producer", "sim-prefill").await;
    let d = serve("kv_consumer", "sim-decode").await;
    for (s, name) in [(&p, "sim-prefill"), (&d, "sim-decode")] {
        let (code, list) = get_json(&format!("{}/v1/models", s.url)).await;
        assert_eq!(code, 200, "{list}");
        check_model_list(&list, name);
    }
}

/// A proxy in front of `p` and `d` (its discovery not yet run).
fn proxy_for(p: &Served, d: &str, extra: &[&str]) -> Proxy {
    let boot = p.engine.bootstrap_url().unwrap();
    let port = boot.rsplit(':').next().unwrap().to_string();
    let mut args: Vec<String> = ["--prefill", &p.url, &port, "--decode", d]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    Proxy::new(ProxyConfig::from_args(&args).unwrap())
}

/// A port nothing listens on.
fn dead_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", l.local_addr().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_models_is_the_decode_list_once_ready() {
    let p = serve("kv_producer", "sim-prefill").await;
    let d = serve("kv_consumer", "sim-decode").await;
    let proxy = proxy_for(&p, &d.url, &[]);
    let url = pd::serve_app(proxy.router()).await;
    // 503 while the prefill instances are not found yet.
    let (code, v) = get_json(&format!("{url}/v1/models")).await;
    assert_eq!(code, 503, "{v}");
    proxy.discover().await.unwrap();
    let (code, list) = get_json(&format!("{url}/v1/models")).await;
    assert_eq!(code, 200, "{list}");
    check_model_list(&list, "sim-decode");
    // /health is still there.
    let r = http().get(format!("{url}/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);

    // A dead decode instance: the prefill instance's list.
    let dead = dead_url();
    let proxy = proxy_for(&p, &dead, &[]);
    let url = pd::serve_app(proxy.router()).await;
    proxy.discover().await.unwrap();
    let (code, list) = get_json(&format!("{url}/v1/models")).await;
    assert_eq!(code, 200, "{list}");
    check_model_list(&list, "sim-prefill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_models_502_names_every_backend() {
    // Discovery needs a prefill instance with a bootstrap server; the one
    // below has one, but its HTTP API has no /v1/models (a stand-in router
    // with /health only), and the decode URL is dead.
    let p = serve("kv_producer", "sim-prefill").await;
    let health_only = pd::serve_app(Router::new().route("/health", get(|| async { "ok" }))).await;
    let boot = p.engine.bootstrap_url().unwrap();
    let port = boot.rsplit(':').next().unwrap();
    let dead = dead_url();
    let args: Vec<String> = ["--prefill", &health_only, port, "--decode", &dead]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let proxy = Proxy::new(ProxyConfig::from_args(&args).unwrap());
    let url = pd::serve_app(proxy.router()).await;
    proxy.discover().await.unwrap();
    let t0 = Instant::now();
    let (code, v) = get_json(&format!("{url}/v1/models")).await;
    assert_eq!(code, 502, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("{dead}/v1/models"))
            && msg.contains(&format!("{health_only}/v1/models")),
        "{msg}"
    );
    assert!(msg.contains("404"), "{msg}");
    assert!(t0.elapsed() < Duration::from_secs(11));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_only_proxy_has_no_health_or_models_and_still_serves() {
    let p = serve("kv_producer", "sim").await;
    let d = serve("kv_consumer", "sim").await;
    let proxy = proxy_for(&p, &d.url, &["--completions-only"]);
    let url = pd::serve_app(proxy.router()).await;
    for path in ["/health", "/v1/models"] {
        let r = http().get(format!("{url}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 404, "{path}");
    }
    // Readiness from a plain completion: 503 until discovery ends.
    let discover = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        proxy.discover().await.unwrap();
        proxy
    });
    let ready = wait_ready(&http(), &url, "sim", Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(ready.by, ReadyBy::Completion);
    assert_eq!(ready.probe_completions, 1);
    assert!(ready.waited >= Duration::from_millis(600), "{ready:?}");
    let _proxy = discover.await.unwrap();
    // The probe was a whole PD request: one transfer.
    let m: Value = http()
        .get(format!("{}/metrics", d.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(m["connector"]["pulls_ok"], 1, "{m}");
    // include_usage goes through the proxy to the decoder and back.
    let prompt = "through the proxy, with usage";
    let (code, text) = post_to(
        &format!("{url}/v1/completions"),
        json!({"model": "sim", "prompt": prompt, "max_tokens": 7, "stream": true,
               "stream_options": {"include_usage": true}}),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        response_text(&text).unwrap(),
        expected_completion(&spec(), prompt, 7)
    );
    assert_eq!(stream_usage(&text).unwrap(), Some(usage(prompt.len(), 7)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_from_models_without_health() {
    let p = serve("kv_producer", "sim").await;
    let d = serve("kv_consumer", "sim").await;
    let proxy = proxy_for(&p, &d.url, &[]);
    let url = pd::serve_app(proxy.router()).await;
    let discover = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        proxy.discover().await.unwrap();
        proxy
    });
    let ready = wait_ready(&http(), &url, "sim", Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(ready.by, ReadyBy::Models);
    assert_eq!(ready.probe_completions, 0);
    assert!(ready.waited >= Duration::from_millis(400), "{ready:?}");
    let _proxy = discover.await.unwrap();

    // A stand-in with /v1/models and no /health at all.
    let models_only = pd::serve_app(Router::new().route(
        "/v1/models",
        get(|| async { axum::Json(json!({"object": "list", "data": []})) }),
    ))
    .await;
    let ready = wait_ready(&http(), &models_only, "sim", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(ready.by, ReadyBy::Models);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_gives_up_in_time_naming_the_url_and_the_probes() {
    // Nothing listens.
    let dead = dead_url();
    let t0 = Instant::now();
    let err = wait_ready(&http(), &dead, "sim", Duration::from_millis(800))
        .await
        .unwrap_err();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert!(
        err.contains(&dead) && err.contains("/v1/models") && err.contains("not tried"),
        "{err}"
    );

    // No /v1/models, and completions that keep failing (503): both named.
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let failing = pd::serve_app(Router::new().route(
        "/v1/completions",
        post(move |axum::Json(body): axum::Json<Value>| {
            let h = h.clone();
            async move {
                assert_eq!(body["prompt"], PROBE_PROMPT);
                assert_eq!(body["max_tokens"], 1);
                h.fetch_add(1, Ordering::SeqCst);
                (
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    "backends not up",
                )
            }
        }),
    ))
    .await;
    let t0 = Instant::now();
    let err = wait_ready(&http(), &failing, "sim", Duration::from_millis(1200))
        .await
        .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(4));
    assert!(
        err.contains("/v1/models: HTTP 404")
            && err.contains("/v1/completions (a plain completion): HTTP 503")
            && err.contains("backends not up"),
        "{err}"
    );
    assert!(hits.load(Ordering::SeqCst) >= 2, "probes are repeated");

    // A server that never answers: each probe is bounded by what is left.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let t0 = Instant::now();
    let err = wait_ready(&http(), &silent_url, "sim", Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert!(err.contains(&silent_url), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_refuses_a_200_that_is_not_a_completion() {
    // vLLM's proxy answers 200 and then breaks the stream when a backend
    // fails; a 200 without a completion in it is not readiness.
    let broken = pd::serve_app(Router::new().route("/v1/completions", post(|| async { "" }))).await;
    let err = wait_ready(&http(), &broken, "sim", Duration::from_millis(700))
        .await
        .unwrap_err();
    assert!(err.contains("HTTP 200 OK, but"), "{err}");
}
