//! The disaggregation proxy, as vLLM's `mooncake_connector_proxy.py`: for
//! each request it mints `transfer_id = "xfer-<uuid>"`, fires the prefill
//! leg (`max_tokens = 1`, not streamed) without waiting for it, and streams
//! the decode leg back, whose `kv_transfer_params` point the decoder at the
//! prefiller's bootstrap server and engine id.
//!
//! Beyond vLLM's proxy it answers `GET /health` (503 until the prefill
//! instances are found) and `GET /v1/models` (the first decode instance's
//! list, see [`Proxy::router`]); `--completions-only` turns both off to
//! stand in for vLLM's proxy. [`wait_ready`] is the client side: readiness
//! of a proxy that may have neither.
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::connector::bootstrap::{BootstrapClient, RetryPolicy};
use crate::connector::HostPort;

/// One `--prefill URL [BOOTSTRAP_PORT|none]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefillTarget {
    /// The prefill API base URL.
    pub url: String,
    /// Its bootstrap port (8998 when omitted or `none`).
    pub bootstrap_port: u16,
}

/// Proxy options (vLLM's CLI, plus an external bootstrap address).
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// `--host` (default 127.0.0.1).
    pub host: String,
    /// `--port` (default 8000).
    pub port: u16,
    /// `--prefill`, repeatable.
    pub prefill: Vec<PrefillTarget>,
    /// `--decode`, repeatable.
    pub decode: Vec<String>,
    /// `--bootstrap-addr host:port`: an external bootstrap server used for
    /// every prefill instance instead of `<prefill host>:<bootstrap port>`.
    pub bootstrap_addr: Option<HostPort>,
    /// `--completions-only`: serve only `/v1/completions` and
    /// `/v1/chat/completions`, as vLLM's proxy (no `/health`, no
    /// `/v1/models`), to check clients that must work with it.
    pub completions_only: bool,
    /// `--prefill-wait-secs` (default 600): how long startup waits for each
    /// prefill instance's `/health` before giving up with an error naming
    /// it (vLLM's proxy waits forever).
    pub prefill_wait: Duration,
}

impl ProxyConfig {
    /// Parses vLLM's proxy flags.
    pub fn from_args(args: &[String]) -> Result<Self, String> {
        let mut c = ProxyConfig {
            host: "127.0.0.1".into(),
            port: 8000,
            prefill: vec![],
            decode: vec![],
            bootstrap_addr: None,
            completions_only: false,
            prefill_wait: Duration::from_secs(600),
        };
        let mut i = 0;
        while i < args.len() {
            let flag = args[i].as_str();
            let val = |i: usize| {
                args.get(i + 1)
                    .cloned()
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            match flag {
                "--host" => {
                    c.host = val(i)?;
                    i += 2;
                }
                "--port" => {
                    c.port = val(i)?
                        .parse()
                        .map_err(|_| "--port: not a port number".to_string())?;
                    i += 2;
                }
                "--decode" => {
                    c.decode.push(val(i)?.trim_end_matches('/').to_string());
                    i += 2;
                }
                "--bootstrap-addr" => {
                    c.bootstrap_addr = Some(
                        HostPort::parse("--bootstrap-addr", &val(i)?).map_err(|e| e.to_string())?,
                    );
                    i += 2;
                }
                "--completions-only" => {
                    c.completions_only = true;
                    i += 1;
                }
                "--prefill-wait-secs" => {
                    let secs: u64 = val(i)?
                        .parse()
                        .map_err(|_| "--prefill-wait-secs: not a number of seconds".to_string())?;
                    c.prefill_wait = Duration::from_secs(secs.max(1));
                    i += 2;
                }
                "--prefill" => {
                    let url = val(i)?.trim_end_matches('/').to_string();
                    i += 2;
                    let mut port = 8998;
                    if let Some(next) = args.get(i).filter(|a| !a.starts_with("--")) {
                        if next != "none" {
                            port = next.parse().map_err(|_| format!("--prefill {url}: bootstrap port {next:?} is not a number or none"))?;
                        }
                        i += 1;
                    }
                    c.prefill.push(PrefillTarget {
                        url,
                        bootstrap_port: port,
                    });
                }
                "-h" | "--help" => return Err(
                    "usage: proxy [--host H] [--port P] --prefill URL [BOOTSTRAP_PORT|none] ... \
                                --decode URL ... [--bootstrap-addr HOST:PORT] [--completions-only] [--prefill-wait-secs N]"
                        .into(),
                ),
                other => return Err(format!("unknown flag {other}")),
            }
        }
        if c.prefill.is_empty() || c.decode.is_empty() {
            return Err("at least one --prefill and one --decode are required".into());
        }
        Ok(c)
    }
}

fn host_of(url: &str) -> String {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let hostport = rest.split('/').next().unwrap_or(rest);
    match hostport.strip_prefix('[') {
        Some(v6) => format!("[{}]", v6.split(']').next().unwrap_or(v6)),
        None => hostport
            .rsplit_once(':')
            .map(|(h, _)| h)
            .unwrap_or(hostport)
            .to_string(),
    }
}

/// One (prefill instance, DP rank) the proxy can send to.
#[derive(Debug, Clone)]
struct PrefillSlot {
    url: String,
    bootstrap: String,
    dp_rank: u32,
    engine_id: String,
}

struct ProxyState {
    cfg: ProxyConfig,
    http: reqwest::Client,
    slots: Mutex<Vec<PrefillSlot>>,
    ready: AtomicBool,
    next_prefill: AtomicUsize,
    next_decode: AtomicUsize,
}

/// The proxy's router; `discover` must run before it answers requests.
pub struct Proxy {
    state: Arc<ProxyState>,
}

impl Proxy {
    /// A proxy for `cfg`.
    pub fn new(cfg: ProxyConfig) -> Self {
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("reqwest client");
        Self {
            state: Arc::new(ProxyState {
                cfg,
                http,
                slots: Mutex::new(vec![]),
                ready: AtomicBool::new(false),
                next_prefill: AtomicUsize::new(0),
                next_decode: AtomicUsize::new(0),
            }),
        }
    }

    /// The HTTP routes: `/v1/completions`, `/v1/chat/completions`, and
    /// unless `completions_only`, `GET /health` and `GET /v1/models`.
    ///
    /// vLLM's proxy has no `/v1/models`; ours answers 503 until the prefill
    /// instances are found (so it doubles as a readiness check), then passes
    /// on the list of the first decode instance that answers (the decode
    /// instances produce every answer, so theirs is the model clients see),
    /// then of the first prefill instance; 502 naming every backend tried
    /// when none answers.
    pub fn router(&self) -> Router {
        let mut r = Router::new();
        if !self.state.cfg.completions_only {
            r = r
                .route("/health", get(health))
                .route("/v1/models", get(models));
        }
        r.route(
            "/v1/completions",
            post(|s, h, b| forward(s, h, b, "/v1/completions")),
        )
        .route(
            "/v1/chat/completions",
            post(|s, h, b| forward(s, h, b, "/v1/chat/completions")),
        )
        .with_state(self.state.clone())
    }

    /// Waits for every prefill instance's `/health` (polling each second),
    /// then reads each bootstrap table for the DP ranks and engine ids.
    pub async fn discover(&self) -> Result<(), String> {
        let s = &self.state;
        let boot = BootstrapClient::new(Duration::from_secs(30), RetryPolicy::default());
        let mut slots = Vec::new();
        for p in &s.cfg.prefill {
            // Polled each second, as vLLM's proxy does, but bounded and
            // saying what it waits for.
            let deadline = tokio::time::Instant::now() + s.cfg.prefill_wait;
            let mut polls = 0u64;
            loop {
                let last = match s
                    .http
                    .get(format!("{}/health", p.url))
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await
                {
                    Ok(r) if r.status().is_success() => break,
                    Ok(r) => format!("answered {}", r.status()),
                    Err(e) => e.to_string(),
                };
                if tokio::time::Instant::now() >= deadline {
                    return Err(format!(
                        "prefill {} did not answer /health within {:?} (--prefill-wait-secs): {last}",
                        p.url, s.cfg.prefill_wait
                    ));
                }
                polls += 1;
                if polls.is_multiple_of(10) {
                    tracing::warn!(target: "mooncake_connector::proxy", prefill = %p.url,
                        "still waiting for the prefill instance's /health: {last}");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let bootstrap = match &s.cfg.bootstrap_addr {
                Some(hp) => hp.url(),
                None => format!("http://{}:{}", host_of(&p.url), p.bootstrap_port),
            };
            let table = boot
                .query(&bootstrap)
                .await
                .map_err(|e| format!("prefill {}: {e}", p.url))?;
            for (dp, entry) in table {
                let dp_rank = dp
                    .parse()
                    .map_err(|_| format!("bootstrap {bootstrap}: dp rank {dp:?}"))?;
                slots.push(PrefillSlot {
                    url: p.url.clone(),
                    bootstrap: bootstrap.clone(),
                    dp_rank,
                    engine_id: entry.engine_id,
                });
            }
            tracing::info!(target: "mooncake_connector::proxy", prefill = %p.url, %bootstrap, "prefill instance ready");
        }
        if slots.is_empty() {
            return Err("no prefill DP rank registered with any bootstrap server".into());
        }
        *s.slots.lock().unwrap() = slots;
        s.ready.store(true, Ordering::SeqCst);
        Ok(())
    }
}

async fn health(State(s): State<Arc<ProxyState>>) -> Response {
    if s.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ok").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "discovering prefill instances",
        )
            .into_response()
    }
}

fn not_ready() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"error": {"message": "the proxy is not ready yet"}})),
    )
        .into_response()
}

/// Most bytes read from a backend's `/v1/models` answer.
const MAX_MODELS_BODY: usize = 1 << 20;

/// How long the proxy waits for one backend's `/v1/models`.
const MODELS_TIMEOUT: Duration = Duration::from_secs(5);

async fn models(State(s): State<Arc<ProxyState>>) -> Response {
    if !s.ready.load(Ordering::SeqCst) {
        return not_ready();
    }
    let auth = crate::connector::config::openai_api_key_from_env();
    let backends = s
        .cfg
        .decode
        .iter()
        .map(|u| ("decode", u.as_str()))
        .chain(s.cfg.prefill.iter().map(|p| ("prefill", p.url.as_str())));
    let mut tried = Vec::new();
    for (role, base) in backends {
        let url = format!("{base}/v1/models");
        let mut req = s.http.get(&url).timeout(MODELS_TIMEOUT);
        if let Some(k) = &auth {
            req = req.bearer_auth(k);
        }
        let why = match req.send().await {
            Ok(r) if r.status().is_success() => {
                match read_capped(r, MAX_MODELS_BODY, MODELS_TIMEOUT).await {
                    Ok(body) => match serde_json::from_slice::<Value>(&body) {
                        Ok(v) if v["object"] == "list" && v["data"].is_array() => {
                            return Json(v).into_response()
                        }
                        Ok(_) => "the answer is not a model list".to_string(),
                        Err(e) => format!("the answer is not JSON: {e}"),
                    },
                    Err(e) => e,
                }
            }
            Ok(r) => format!("HTTP {}", r.status()),
            Err(e) => with_causes(&e),
        };
        tracing::warn!(target: "mooncake_connector::proxy", %url, "{role} backend's model list: {why}");
        tried.push(format!("{url}: {why}"));
    }
    (
        StatusCode::BAD_GATEWAY,
        Json(json!({"error": {
            "message": format!("no backend answered /v1/models ({})", tried.join("; ")),
            "type": "bad_gateway", "code": 502}})),
    )
        .into_response()
}

/// An error and its causes ("error sending request" alone hides "connection
/// refused").
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// Reads at most `max` bytes of `r`'s body within `within`.
async fn read_capped(
    mut r: reqwest::Response,
    max: usize,
    within: Duration,
) -> Result<Vec<u8>, String> {
    let read = async {
        let mut body = Vec::new();
        while let Some(chunk) = r.chunk().await.map_err(|e| with_causes(&e))? {
            if body.len() + chunk.len() > max {
                return Err(format!("the answer is over {max} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    };
    tokio::time::timeout(within, read)
        .await
        .map_err(|_| format!("the answer took over {within:?}"))?
}

async fn forward(
    State(s): State<Arc<ProxyState>>,
    _headers: HeaderMap,
    body: Json<Value>,
    path: &'static str,
) -> Response {
    if !s.ready.load(Ordering::SeqCst) {
        return not_ready();
    }
    let body = body.0;
    if !body.is_object() {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": {"message": "the body must be a JSON object"}})),
        )
            .into_response();
    }
    let request_id = uuid::Uuid::new_v4().to_string();
    let transfer_id = format!("xfer-{request_id}");
    let slot = {
        let slots = s.slots.lock().unwrap();
        slots[s.next_prefill.fetch_add(1, Ordering::Relaxed) % slots.len()].clone()
    };
    let decode_url =
        s.cfg.decode[s.next_decode.fetch_add(1, Ordering::Relaxed) % s.cfg.decode.len()].clone();
    let leg = Leg {
        path,
        request_id: &request_id,
        auth: crate::connector::config::openai_api_key_from_env(),
    };
    spawn_prefill_leg(&s, &slot, &leg, prefill_body(&body, &transfer_id));

    // Decode leg: streamed back.
    let mut dbody = body;
    dbody.as_object_mut().expect("object").insert(
        "kv_transfer_params".into(),
        json!({"do_remote_decode": false, "do_remote_prefill": true, "remote_bootstrap_addr": slot.bootstrap,
               "remote_engine_id": slot.engine_id, "transfer_id": transfer_id}),
    );
    decode_leg(&s, &decode_url, &leg, &dbody).await
}

/// What both legs of one request share.
struct Leg<'a> {
    path: &'static str,
    request_id: &'a str,
    auth: Option<String>,
}

/// The prefill leg's body: `body` (a JSON object) asking for one
/// non-streamed token and remote decode under `transfer_id`.
fn prefill_body(body: &Value, transfer_id: &str) -> Value {
    let mut pbody = body.clone();
    let o = pbody.as_object_mut().expect("object");
    o.insert(
        "kv_transfer_params".into(),
        json!({"do_remote_decode": true, "do_remote_prefill": false, "transfer_id": transfer_id}),
    );
    o.insert("stream".into(), json!(false));
    o.insert("max_tokens".into(), json!(1));
    if o.contains_key("max_completion_tokens") {
        o.insert("max_completion_tokens".into(), json!(1));
    }
    o.remove("stream_options");
    pbody
}

/// Prefill leg: fire and forget.
fn spawn_prefill_leg(s: &ProxyState, slot: &PrefillSlot, leg: &Leg<'_>, pbody: Value) {
    let mut preq = s
        .http
        .post(format!("{}{}", slot.url, leg.path))
        .json(&pbody)
        .header("X-Request-Id", leg.request_id)
        .header("X-data-parallel-rank", slot.dp_rank.to_string());
    if let Some(k) = &leg.auth {
        preq = preq.bearer_auth(k);
    }
    let rid = leg.request_id.to_string();
    tokio::spawn(async move {
        match preq.send().await {
            Ok(r) => {
                let status = r.status();
                let _ = r.bytes().await;
                tracing::debug!(target: "mooncake_connector::proxy", request = %rid, %status, "prefill leg done");
            }
            Err(e) => {
                tracing::warn!(target: "mooncake_connector::proxy", request = %rid, "prefill leg failed: {e}")
            }
        }
    });
}

/// Decode leg: sends `dbody` to `decode_url` and streams its answer back.
async fn decode_leg(s: &ProxyState, decode_url: &str, leg: &Leg<'_>, dbody: &Value) -> Response {
    let mut dreq = s
        .http
        .post(format!("{decode_url}{}", leg.path))
        .json(dbody)
        .header("X-Request-Id", leg.request_id);
    if let Some(k) = &leg.auth {
        dreq = dreq.bearer_auth(k);
    }
    match dreq.send().await {
        Ok(r) => {
            let status =
                StatusCode::from_u16(r.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            let ctype = r.headers().get("content-type").cloned();
            let mut resp = Response::builder().status(status);
            if let Some(c) = ctype {
                resp = resp.header("content-type", c);
            }
            resp.body(Body::from_stream(r.bytes_stream()))
                .expect("response")
        }
        Err(e) => (
            StatusCode::BAD_GATEWAY,
            Json(json!({"error": {"message": format!("decode {decode_url}: {e}")}})),
        )
            .into_response(),
    }
}

/// How [`wait_ready`] found a server ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadyBy {
    /// `GET /v1/models` answered a model list.
    Models,
    /// It has no `/v1/models` (404 or 405); a plain completion was
    /// answered.
    Completion,
}

/// What [`wait_ready`] found.
#[derive(Debug, Clone)]
pub struct Readiness {
    /// Which probe answered.
    pub by: ReadyBy,
    /// Probe completions that were answered (0 or 1). Behind a
    /// disaggregation proxy each is a whole request, KV transfer included,
    /// which a caller counting transfers must add.
    pub probe_completions: usize,
    /// How long it took.
    pub waited: Duration,
}

/// The prompt of the probe completion [`wait_ready`] sends.
pub const PROBE_PROMPT: &str = "readiness probe";

/// Most bytes [`wait_ready`] reads of a probe's answer.
const MAX_PROBE_BODY: usize = 1 << 20;

/// Waits, at most `wait`, until the OpenAI-style server or proxy at `url`
/// is ready, without `/health` (vLLM's proxy has none): `GET /v1/models`
/// answering a model list; when that route is absent (404 or 405), a plain
/// completion (`model`, [`PROBE_PROMPT`], one token, not streamed) answered
/// with text. Anything else (no connection, 503 while the proxy discovers
/// its prefill instances, a broken answer) is tried again every 250 ms.
/// The error names the URL, each probe tried and its last outcome.
pub async fn wait_ready(
    http: &reqwest::Client,
    url: &str,
    model: &str,
    wait: Duration,
) -> Result<Readiness, String> {
    let url = url.trim_end_matches('/');
    let models_url = format!("{url}/v1/models");
    let completions_url = format!("{url}/v1/completions");
    let t0 = Instant::now();
    let deadline = t0 + wait;
    let mut models_absent = false;
    let mut last_models = "no answer yet".to_string();
    let mut last_completion: Option<String> = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let completion = match &last_completion {
                Some(why) => format!("POST {completions_url} (a plain completion): {why}"),
                None => format!(
                    "POST {completions_url}: not tried (only once /v1/models answers 404 or 405)"
                ),
            };
            return Err(format!(
                "{url} not ready after {wait:?}; tried GET {models_url}: {last_models}; {completion}"
            ));
        }
        if !models_absent {
            let per_try = left.min(Duration::from_secs(5));
            match http.get(&models_url).timeout(per_try).send().await {
                Ok(r) if r.status().is_success() => {
                    match read_capped(r, MAX_PROBE_BODY, per_try).await {
                        Ok(b) => match serde_json::from_slice::<Value>(&b) {
                            Ok(v) if v["object"] == "list" && v["data"].is_array() => {
                                return Ok(Readiness {
                                    by: ReadyBy::Models,
                                    probe_completions: 0,
                                    waited: t0.elapsed(),
                                });
                            }
                            _ => last_models = "answered, but not a model list".into(),
                        },
                        Err(e) => last_models = e,
                    }
                }
                Ok(r) if matches!(r.status().as_u16(), 404 | 405) => {
                    last_models = format!("HTTP {} (no such route)", r.status());
                    models_absent = true;
                    continue;
                }
                Ok(r) => last_models = format!("HTTP {}", r.status()),
                Err(e) => last_models = with_causes(&e),
            }
        } else {
            let per_try = left.min(Duration::from_secs(30));
            let body =
                json!({"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "stream": false});
            let why = match http
                .post(&completions_url)
                .json(&body)
                .timeout(per_try)
                .send()
                .await
            {
                Ok(r) => {
                    let status = r.status();
                    match read_capped(r, MAX_PROBE_BODY, per_try).await {
                        Ok(b) if status.is_success() => {
                            let text = String::from_utf8_lossy(&b);
                            match super::server::response_text(&text) {
                                Ok(_) => {
                                    return Ok(Readiness {
                                        by: ReadyBy::Completion,
                                        probe_completions: 1,
                                        waited: t0.elapsed(),
                                    })
                                }
                                Err(e) => format!("HTTP {status}, but {e}"),
                            }
                        }
                        Ok(b) => format!(
                            "HTTP {status}: {}",
                            String::from_utf8_lossy(&b[..b.len().min(300)])
                        ),
                        Err(e) => format!("HTTP {status}, then {e}"),
                    }
                }
                Err(e) => with_causes(&e),
            };
            last_completion = Some(why);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(left.min(Duration::from_millis(250))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn vllm_proxy_flags() {
        let c = ProxyConfig::from_args(&args(
            "--prefill http://10.0.0.2:8010 --prefill http://10.0.0.3:8010 9000 --prefill http://10.0.0.4:8010 none \
             --decode http://10.0.0.5:8020 --port 8001",
        ))
        .unwrap();
        assert_eq!(c.port, 8001);
        assert_eq!(c.host, "127.0.0.1");
        assert_eq!(
            c.prefill
                .iter()
                .map(|p| p.bootstrap_port)
                .collect::<Vec<_>>(),
            [8998, 9000, 8998]
        );
        assert_eq!(c.decode, ["http://10.0.0.5:8020"]);
        assert!(ProxyConfig::from_args(&args("--decode http://x:1")).is_err());
        assert!(
            ProxyConfig::from_args(&args("--prefill http://x:1 abc --decode http://y:2")).is_err()
        );
        let e = ProxyConfig::from_args(&args(
            "--prefill http://x:1 --decode http://y:2 --bootstrap-addr nohost",
        ))
        .unwrap_err();
        assert!(e.contains("--bootstrap-addr"), "{e}");
        assert_eq!(host_of("http://10.0.0.2:8010"), "10.0.0.2");
        assert_eq!(host_of("http://[::1]:8010/x"), "[::1]");
        assert_eq!(host_of("http://localhost"), "localhost");
    }

    #[tokio::test]
    async fn startup_gives_up_on_a_prefill_that_never_answers() {
        // A port nobody listens on (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let c = ProxyConfig::from_args(&args(&format!(
            "--prefill http://127.0.0.1:{port} --decode http://127.0.0.1:{port} --prefill-wait-secs 1"
        )))
        .unwrap();
        assert_eq!(c.prefill_wait, Duration::from_secs(1));
        let started = Instant::now();
        let e = Proxy::new(c).discover().await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(e.contains("did not answer /health"), "{e}");
        assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
    }
}
