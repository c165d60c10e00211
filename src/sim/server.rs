//! The OpenAI-style HTTP API of a simulated engine: `/health`,
//! `/v1/models`, `/v1/completions`, `/v1/chat/completions` (streaming and
//! not, with vLLM's `stream_options`) and `/metrics`.
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use super::engine::{
    GenerateError, GenerateOutput, GenerateRequest, KvSource, KvTransferParams, SimEngine,
};
use super::model;
use super::request::StreamOptions;

/// The router for an engine.
pub fn router(engine: Arc<SimEngine>) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .with_state(engine)
}

async fn metrics(State(e): State<Arc<SimEngine>>) -> Json<Value> {
    Json(e.metrics())
}

/// `GET /v1/models` in the shape of vLLM's `ModelList`: one card for the
/// served model; `root` is the model name (the simulator loads no path) and
/// `max_model_len` the tokens the KV cache holds.
async fn models(State(e): State<Arc<SimEngine>>) -> Json<Value> {
    let cfg = e.config();
    let max_model_len = cfg.spec.num_blocks.saturating_mul(cfg.spec.block_size);
    Json(model_list(&cfg.model_name, max_model_len, now()))
}

/// vLLM's `ModelList` with one `ModelCard` (and its default
/// `ModelPermission`).
fn model_list(name: &str, max_model_len: usize, created: u64) -> Value {
    json!({
        "object": "list",
        "data": [{
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": name,
            "parent": null,
            "max_model_len": max_model_len,
            "permission": [{
                "id": format!("modelperm-{}", uuid::Uuid::new_v4().simple()),
                "object": "model_permission",
                "created": created,
                "allow_create_engine": false,
                "allow_sampling": true,
                "allow_logprobs": true,
                "allow_search_indices": false,
                "allow_view": true,
                "allow_fine_tuning": false,
                "organization": "*",
                "group": null,
                "is_blocking": false,
            }],
        }],
    })
}

fn error_response(status: u16, kind: &str, message: &str) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        code,
        Json(json!({"error": {"message": message, "type": kind, "code": status}})),
    )
        .into_response()
}

impl IntoResponse for GenerateError {
    fn into_response(self) -> Response {
        error_response(self.status, self.kind, &self.message)
    }
}

struct Parsed {
    prompt: String,
    max_tokens: usize,
    stream: bool,
    stream_options: StreamOptions,
    kv: Option<KvTransferParams>,
    model: String,
}

fn parse_common(
    body: &Value,
    prompt: String,
    default_model: &str,
) -> Result<Parsed, GenerateError> {
    let bad = |m: String| GenerateError {
        status: 400,
        kind: "invalid_request_error",
        message: m,
    };
    let max_tokens = match body
        .get("max_completion_tokens")
        .or_else(|| body.get("max_tokens"))
    {
        None | Some(Value::Null) => 16,
        Some(v) => v
            .as_u64()
            .filter(|n| (1..=1_000_000).contains(n))
            .ok_or_else(|| bad(format!("max_tokens {v} is not a positive integer")))?
            as usize,
    };
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let stream_options = StreamOptions::from_body(body, stream)?;
    let kv = match body.get("kv_transfer_params") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            serde_json::from_value(v.clone())
                .map_err(|e| bad(format!("kv_transfer_params: {e}")))?,
        ),
    };
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(default_model)
        .to_string();
    Ok(Parsed {
        prompt,
        max_tokens,
        stream,
        stream_options,
        kv,
        model,
    })
}

fn request_id(headers: &HeaderMap) -> String {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

fn check_dp_rank(engine: &SimEngine, headers: &HeaderMap) -> Result<(), GenerateError> {
    if let Some(v) = headers.get("x-data-parallel-rank") {
        let rank: u32 = v
            .to_str()
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| GenerateError {
                status: 400,
                kind: "invalid_request_error",
                message: "X-data-parallel-rank is not an integer".into(),
            })?;
        if rank != engine.config().dp_rank {
            return Err(GenerateError {
                status: 400,
                kind: "invalid_request_error",
                message: format!(
                    "this engine serves data-parallel rank {}, not {rank}",
                    engine.config().dp_rank
                ),
            });
        }
    }
    Ok(())
}

/// Sets the flag when dropped: the client went away before the response.
struct CancelOnDrop(Arc<AtomicBool>, bool);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.1 {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

async fn run(
    engine: Arc<SimEngine>,
    req: GenerateRequest,
) -> Result<GenerateOutput, GenerateError> {
    let cancelled = Arc::new(AtomicBool::new(false));
    let mut guard = CancelOnDrop(cancelled.clone(), false);
    // The request runs in its own task so that a client leaving never cuts
    // it at a point where a transfer may still touch its blocks.
    let task = tokio::spawn(async move { engine.generate(req, cancelled).await });
    let out = task.await.unwrap_or_else(|e| {
        Err(GenerateError {
            status: 500,
            kind: "internal_error",
            message: format!("request task failed: {e}"),
        })
    });
    guard.1 = true;
    out
}

/// What both OpenAI endpoints do once the prompt is known: common fields,
/// the data-parallel rank check, and the generation itself.
struct Served {
    p: Parsed,
    id: String,
    out: GenerateOutput,
    created: u64,
}

async fn serve(
    engine: Arc<SimEngine>,
    headers: &HeaderMap,
    body: &Value,
    prompt: String,
    id_prefix: &str,
) -> Result<Served, GenerateError> {
    let mut p = parse_common(body, prompt, &engine.config().model_name)?;
    check_dp_rank(&engine, headers)?;
    let id = format!("{id_prefix}-{}", request_id(headers));
    let req = GenerateRequest {
        request_id: id.clone(),
        prompt: std::mem::take(&mut p.prompt),
        max_tokens: p.max_tokens,
        kv: p.kv.take(),
    };
    let out = run(engine, req).await?;
    Ok(Served {
        p,
        id,
        out,
        created: now(),
    })
}

fn usage(out: &GenerateOutput) -> Value {
    usage_so_far(out, out.completion_tokens)
}

fn usage_so_far(out: &GenerateOutput, completion_tokens: usize) -> Value {
    json!({"prompt_tokens": out.prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": out.prompt_tokens + completion_tokens})
}

/// One streamed chunk's frame: the fields every chunk of a response shares.
struct Chunks<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    out: &'a GenerateOutput,
    opts: StreamOptions,
    /// vLLM writes `"usage": null` on completion chunks and leaves the key
    /// out of chat chunks when there is no usage to report.
    null_usage: bool,
}

impl Chunks<'_> {
    /// A chunk with `choice`, `tokens` completion tokens generated so far.
    fn chunk(&self, choice: Value, tokens: usize) -> Value {
        let mut v = json!({"id": self.id, "object": self.object, "created": self.created,
                           "model": self.model, "choices": [choice]});
        if self.opts.continuous_usage_stats {
            v["usage"] = usage_so_far(self.out, tokens);
        } else if self.null_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    /// With `include_usage`, the last chunk: no choices, the whole usage.
    fn usage_chunk(&self) -> Option<Value> {
        self.opts.include_usage.then(|| {
            json!({"id": self.id, "object": self.object, "created": self.created,
                   "model": self.model, "choices": [], "usage": usage(self.out)})
        })
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn sse(events: Vec<Value>) -> Response {
    let mut chunks: Vec<Result<String, Infallible>> = events
        .into_iter()
        .map(|e| Ok(format!("data: {e}\n\n")))
        .collect();
    chunks.push(Ok("data: [DONE]\n\n".to_string()));
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .expect("static response")
}

fn kv_source(s: KvSource) -> &'static str {
    match s {
        KvSource::Local => "local",
        KvSource::Remote => "remote",
        KvSource::Recomputed => "recomputed",
    }
}

async fn completions(
    State(engine): State<Arc<SimEngine>>,
    headers: HeaderMap,
    body: Json<Value>,
) -> Response {
    let body = body.0;
    let prompt = match body.get("prompt") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            a[0].as_str().unwrap().to_string()
        }
        _ => return error_response(400, "invalid_request_error", "prompt must be a string"),
    };
    let Served {
        p,
        id,
        out,
        created,
    } = match serve(engine, &headers, &body, prompt, "cmpl").await {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    if p.stream {
        let c = Chunks {
            id: &id,
            object: "text_completion",
            created,
            model: &p.model,
            out: &out,
            opts: p.stream_options,
            null_usage: true,
        };
        let mut events: Vec<Value> = out
            .text
            .chars()
            .enumerate()
            .map(|(i, ch)| {
                c.chunk(
                    json!({"index": 0, "text": ch.to_string(), "logprobs": null, "finish_reason": null}),
                    i + 1,
                )
            })
            .collect();
        events.push(c.chunk(
            json!({"index": 0, "text": "", "logprobs": null, "finish_reason": out.finish_reason}),
            out.completion_tokens,
        ));
        events.extend(c.usage_chunk());
        return sse(events);
    }
    Json(json!({
        "id": id, "object": "text_completion", "created": created, "model": p.model,
        "choices": [{"index": 0, "text": out.text, "logprobs": null, "finish_reason": out.finish_reason}],
        "usage": usage(&out),
        "kv_source": kv_source(out.kv_source),
    }))
    .into_response()
}

async fn chat(
    State(engine): State<Arc<SimEngine>>,
    headers: HeaderMap,
    body: Json<Value>,
) -> Response {
    let body = body.0;
    let Some(msgs) = body.get("messages").and_then(Value::as_array) else {
        return error_response(400, "invalid_request_error", "messages must be an array");
    };
    let mut turns = Vec::new();
    for m in msgs {
        let (Some(role), Some(content)) = (
            m.get("role").and_then(Value::as_str),
            m.get("content").and_then(Value::as_str),
        ) else {
            return error_response(
                400,
                "invalid_request_error",
                "each message needs a string role and content",
            );
        };
        turns.push((role.to_string(), content.to_string()));
    }
    let prompt = model::chat_prompt(&turns);
    let Served {
        p,
        id,
        out,
        created,
    } = match serve(engine, &headers, &body, prompt, "chatcmpl").await {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    if p.stream {
        let c = Chunks {
            id: &id,
            object: "chat.completion.chunk",
            created,
            model: &p.model,
            out: &out,
            opts: p.stream_options,
            null_usage: false,
        };
        let mut events = vec![c.chunk(
            json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}),
            0,
        )];
        events.extend(out.text.chars().enumerate().map(|(i, ch)| {
            c.chunk(
                json!({"index": 0, "delta": {"content": ch.to_string()}, "finish_reason": null}),
                i + 1,
            )
        }));
        events.push(c.chunk(
            json!({"index": 0, "delta": {}, "finish_reason": out.finish_reason}),
            out.completion_tokens,
        ));
        events.extend(c.usage_chunk());
        return sse(events);
    }
    Json(json!({
        "id": id, "object": "chat.completion", "created": created, "model": p.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": out.text}, "finish_reason": out.finish_reason}],
        "usage": usage(&out),
        "kv_source": kv_source(out.kv_source),
    }))
    .into_response()
}

/// Collects the text of an OpenAI response body, streamed (SSE) or not.
pub fn response_text(body: &str) -> Result<String, String> {
    if body.trim_start().starts_with("data:") {
        let mut text = String::new();
        for line in body.lines() {
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                return Ok(text);
            }
            let v: Value =
                serde_json::from_str(data).map_err(|e| format!("bad SSE chunk {data:?}: {e}"))?;
            let c = &v["choices"][0];
            if let Some(t) = c["text"].as_str() {
                text.push_str(t);
            } else if let Some(t) = c["delta"]["content"].as_str() {
                text.push_str(t);
            }
        }
        Err("the stream ended without [DONE]".into())
    } else {
        let v: Value =
            serde_json::from_str(body).map_err(|e| format!("bad JSON response: {e}: {body}"))?;
        if let Some(err) = v.get("error") {
            return Err(format!("error response: {err}"));
        }
        let c = &v["choices"][0];
        c["text"]
            .as_str()
            .or_else(|| c["message"]["content"].as_str())
            .map(str::to_string)
            .ok_or_else(|| format!("no text in {v}"))
    }
}

/// The `usage` of a streamed (SSE) response's usage chunk, the one with
/// empty `choices` that `stream_options.include_usage` asks for: `None`
/// when the stream has none. An error when the body is not a whole stream,
/// or when the usage chunk is not the last one before `[DONE]`.
pub fn stream_usage(body: &str) -> Result<Option<Value>, String> {
    let mut usage = None;
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            return Ok(usage);
        }
        if usage.is_some() {
            return Err(format!("a chunk after the usage chunk: {data}"));
        }
        let v: Value =
            serde_json::from_str(data).map_err(|e| format!("bad SSE chunk {data:?}: {e}"))?;
        if v["choices"].as_array().is_some_and(|c| c.is_empty()) {
            usage = Some(v["usage"].clone());
        }
    }
    Err("the stream ended without [DONE]".into())
}
