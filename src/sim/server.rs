//! The OpenAI-style HTTP API of a simulated engine: `/health`,
//! `/v1/completions`, `/v1/chat/completions` (streaming and not) and
//! `/metrics`.
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

/// The router for an engine.
pub fn router(engine: Arc<SimEngine>) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .with_state(engine)
}

async fn metrics(State(e): State<Arc<SimEngine>>) -> Json<Value> {
    Json(e.metrics())
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
    json!({"prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
           "total_tokens": out.prompt_tokens + out.completion_tokens})
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
        let mut events: Vec<Value> = out
            .text
            .chars()
            .map(|c| json!({"id": id, "object": "text_completion", "created": created, "model": p.model,
                            "choices": [{"index": 0, "text": c.to_string(), "logprobs": null, "finish_reason": null}]}))
            .collect();
        events.push(json!({"id": id, "object": "text_completion", "created": created, "model": p.model,
                           "choices": [{"index": 0, "text": "", "logprobs": null, "finish_reason": out.finish_reason}]}));
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
        let mut events = vec![
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": p.model,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}),
        ];
        events.extend(out.text.chars().map(|c| json!({"id": id, "object": "chat.completion.chunk", "created": created,
            "model": p.model, "choices": [{"index": 0, "delta": {"content": c.to_string()}, "finish_reason": null}]})));
        events.push(json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": p.model,
            "choices": [{"index": 0, "delta": {}, "finish_reason": out.finish_reason}]}));
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
