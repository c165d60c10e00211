//! Sends a bounded set of requests to the proxy (several at once, prompts of
//! different lengths, completions and chat, streamed and not) and checks
//! every answer against what the simulated model must produce from correct
//! KV. Exits non-zero on any mismatch. Used by `scripts/run_pd_example.sh`.
//!
//! It waits for the proxy without `/health` (vLLM's proxy has none): until
//! `GET /v1/models` answers a model list or, where that route is absent, a
//! plain completion is answered, for at most `--wait-secs` (120). It
//! prints `readiness probe completions: N`: each one was a whole request
//! through the proxy, KV transfer included. Every fourth request streams
//! with `stream_options.include_usage` and checks the usage chunk.
//!
//! ```text
//! cargo run --example pd_client -- --url http://127.0.0.1:8000 --requests 16 --concurrency 4
//! ```
use std::time::{Duration, Instant};

use mooncake_connector::sim::model::{chat_prompt, expected_completion, tokenize, ModelSpec};
use mooncake_connector::sim::proxy::{wait_ready, ReadyBy};
use mooncake_connector::sim::server::{response_text, stream_usage};
use serde_json::json;

struct Args {
    url: String,
    requests: usize,
    concurrency: usize,
    max_tokens: usize,
    model: String,
    spec: ModelSpec,
    wait: Duration,
    min_len: usize,
    max_len: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        url: "http://127.0.0.1:8000".into(),
        requests: 16,
        concurrency: 4,
        max_tokens: 24,
        model: "sim".into(),
        spec: ModelSpec::default(),
        wait: Duration::from_secs(120),
        min_len: 20,
        max_len: 3000,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        // The model's switches (they must match the engines').
        match args[i].as_str() {
            "--mla" => a.spec.mla = true,
            "--hybrid" => a.spec.hybrid = true,
            _ => {}
        }
        if matches!(args[i].as_str(), "--mla" | "--hybrid") {
            i += 1;
            continue;
        }
        let v = args
            .get(i + 1)
            .cloned()
            .ok_or(format!("{} needs a value", args[i]))?;
        let n = || {
            v.parse::<usize>()
                .map_err(|_| format!("{}: {v:?} is not a number", args[i]))
        };
        match args[i].as_str() {
            "--url" => a.url = v.trim_end_matches('/').to_string(),
            "--requests" => a.requests = n()?,
            "--concurrency" => a.concurrency = n()?.max(1),
            "--max-tokens" => a.max_tokens = n()?,
            "--model" => a.model = v.clone(),
            "--layers" => a.spec.layers = n()?,
            "--heads" => a.spec.heads = n()?,
            "--head-size" => a.spec.head_size = n()?,
            "--block-size" => a.spec.block_size = n()?,
            "--wait-secs" => a.wait = Duration::from_secs(n()? as u64),
            "--min-len" => a.min_len = n()?,
            "--max-len" => a.max_len = n()?,
            other => return Err(format!("unknown flag {other}")),
        }
        i += 2;
    }
    Ok(a)
}

fn prompt(i: usize, len: usize) -> String {
    let words = [
        "kv", "cache", "prefill", "decode", "mooncake", "transfer", "block", "layer", "head",
        "token",
    ];
    let mut s = format!("request {i}:");
    let mut k = i;
    while s.len() < len {
        k = k
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        s.push(' ');
        s.push_str(words[(k >> 33) % words.len()]);
    }
    s.truncate(len);
    s
}

#[tokio::main]
async fn main() {
    let a = parse().unwrap_or_else(|e| {
        eprintln!("pd_client: {e}");
        std::process::exit(2)
    });
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    match wait_ready(&http, &a.url, &a.model, a.wait).await {
        Ok(r) => {
            let by = match r.by {
                ReadyBy::Models => "GET /v1/models",
                ReadyBy::Completion => "a plain completion (no /v1/models)",
            };
            println!(
                "{} ready after {:.1} s ({by})",
                a.url,
                r.waited.as_secs_f64()
            );
            println!("readiness probe completions: {}", r.probe_completions);
        }
        Err(e) => {
            eprintln!("pd_client: {e}");
            std::process::exit(1);
        }
    }
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(a.concurrency));
    let mut tasks = Vec::new();
    for i in 0..a.requests {
        let span = a.max_len.saturating_sub(a.min_len).max(1);
        let len = a.min_len + (i * 7919) % span;
        let (chat, stream) = (i % 3 == 1, i % 2 == 1);
        let usage = i % 4 == 3;
        let text = prompt(i, len);
        let (path, mut body, model_prompt) = if chat {
            let msgs = vec![("user".to_string(), text.clone())];
            (
                "/v1/chat/completions",
                json!({"model": a.model, "messages": [{"role": "user", "content": text}], "max_tokens": a.max_tokens, "stream": stream}),
                chat_prompt(&msgs),
            )
        } else {
            (
                "/v1/completions",
                json!({"model": a.model, "prompt": text, "max_tokens": a.max_tokens, "stream": stream}),
                text.clone(),
            )
        };
        let prompt_tokens = tokenize(&model_prompt).len();
        if usage {
            body["stream_options"] = json!({"include_usage": true});
        }
        let want = expected_completion(&a.spec, &model_prompt, a.max_tokens);
        let (http, url, sem) = (http.clone(), format!("{}{path}", a.url), sem.clone());
        tasks.push(tokio::spawn(async move {
            let _p = sem.acquire().await.unwrap();
            let started = Instant::now();
            let r = http
                .post(&url)
                .json(&body)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = r.status();
            let text = r.text().await.map_err(|e| e.to_string())?;
            if !status.is_success() {
                return Err(format!("HTTP {status}: {text}"));
            }
            let got = response_text(&text)?;
            if got != want {
                return Err(format!("wrong output: got {got:?}, want {want:?}"));
            }
            if usage {
                let want = json!({"prompt_tokens": prompt_tokens, "completion_tokens": want.len(),
                                  "total_tokens": prompt_tokens + want.len()});
                match stream_usage(&text)? {
                    Some(u) if u == want => {}
                    other => return Err(format!("usage chunk {other:?}, want {want}")),
                }
            }
            Ok::<_, String>((len, chat, stream, usage, started.elapsed()))
        }));
    }
    let mut failures = 0;
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await.unwrap() {
            Ok((len, chat, stream, usage, dt)) => println!(
                "request {i:>3}: {len:>5} prompt bytes, {:<10} {:<15} ok ({:.0} ms)",
                if chat { "chat" } else { "completion" },
                match (stream, usage) {
                    (true, true) => "streamed+usage",
                    (true, false) => "streamed",
                    _ => "whole",
                },
                dt.as_secs_f64() * 1e3
            ),
            Err(e) => {
                failures += 1;
                println!("request {i:>3}: FAILED: {e}");
            }
        }
    }
    if failures > 0 {
        eprintln!("pd_client: {failures} of {} requests failed", a.requests);
        std::process::exit(1);
    }
    println!(
        "all {} answers match the model's output for correctly transferred KV",
        a.requests
    );
}
