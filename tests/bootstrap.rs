//! The bootstrap server's JSON shapes, status codes and conflict rules, and
//! the client's retry schedule against servers that start late, answer
//! slowly or refuse.
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use mooncake_connector::connector::bootstrap::{
    BootstrapClient, BootstrapServer, ExpectedTopology, RegisterRequest, RetryPolicy,
};
use serde_json::{json, Value};

fn reg(engine: &str, dp: u32, tp: u32, addr: &str) -> RegisterRequest {
    RegisterRequest {
        engine_id: engine.into(),
        dp_rank: dp,
        tp_rank: tp,
        pp_rank: 0,
        addr: addr.into(),
        ..Default::default()
    }
}

async fn post_json(url: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn register_and_query_shapes_and_conflicts() {
    let s = BootstrapServer::start("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let url = s.url();
    // A live worker's side channel: its slot cannot be taken over.
    let live = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a1 = format!("tcp://{}", live.local_addr().unwrap());
    let (code, body) = post_json(
        &format!("{url}/register"),
        &json!({"engine_id":"e1","dp_rank":0,"tp_rank":0,"pp_rank":0,"addr":a1}),
    )
    .await;
    assert_eq!((code, body), (200, json!({"status":"ok"})));
    post_json(&format!("{url}/register"), &json!({"engine_id":"e1","dp_rank":0,"tp_rank":1,"pp_rank":0,"addr":"tcp://127.0.0.1:40002"})).await;
    post_json(&format!("{url}/register"), &json!({"engine_id":"e2","dp_rank":1,"tp_rank":0,"pp_rank":0,"addr":"tcp://127.0.0.1:40003"})).await;
    let q: Value = reqwest::get(format!("{url}/query"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        q,
        json!({
            "0": {"engine_id":"e1","worker_addr":{"0":{"0":a1},"1":{"0":"tcp://127.0.0.1:40002"}}},
            "1": {"engine_id":"e2","worker_addr":{"0":{"0":"tcp://127.0.0.1:40003"}}}
        })
    );
    // Identical re-registration (a retried request) is fine.
    let (code, _) = post_json(
        &format!("{url}/register"),
        &json!({"engine_id":"e1","dp_rank":0,"tp_rank":0,"pp_rank":0,"addr":a1}),
    )
    .await;
    assert_eq!(code, 200);
    // The DP rank belongs to another engine.
    let (code, body) = post_json(&format!("{url}/register"), &json!({"engine_id":"e3","dp_rank":0,"tp_rank":2,"pp_rank":0,"addr":"tcp://127.0.0.1:40009"})).await;
    assert_eq!(code, 400);
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("already registered by engine_id e1"),
        "{body}"
    );
    // The slot is taken, by a live worker, with another address: 400, as vLLM answers.
    let (code, body) = post_json(&format!("{url}/register"), &json!({"engine_id":"e1","dp_rank":0,"tp_rank":0,"pp_rank":0,"addr":"tcp://127.0.0.1:49999"})).await;
    assert_eq!(code, 400);
    assert!(body["detail"].as_str().unwrap().contains(&a1), "{body}");
    // Malformed bodies: 422, like FastAPI.
    let (code, _) = post_json(
        &format!("{url}/register"),
        &json!({"engine_id":"e1","dp_rank":"zero"}),
    )
    .await;
    assert_eq!(code, 422);
    let r = reqwest::Client::new()
        .post(format!("{url}/register"))
        .body("not json")
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_client_error());
    // Nothing changed.
    let again: Value = reqwest::get(format!("{url}/query"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again, q);
    s.stop().await;
}

#[tokio::test]
async fn query_is_refused_until_the_topology_is_complete() {
    let s = BootstrapServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Some(ExpectedTopology {
            dp_size: 1,
            tp_size: 2,
            pp_size: 1,
        }),
    )
    .await
    .unwrap();
    let url = s.url();
    let client = BootstrapClient::new(Duration::from_secs(2), RetryPolicy::default());
    client
        .register(&url, &reg("e", 0, 0, "tcp://127.0.0.1:1"))
        .await
        .unwrap();
    let r = reqwest::get(format!("{url}/query")).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["detail"].as_str().unwrap().contains("tp_rank 1"),
        "{body}"
    );
    client
        .register(&url, &reg("e", 0, 1, "tcp://127.0.0.1:2"))
        .await
        .unwrap();
    let table = client.query(&url).await.unwrap();
    assert_eq!(table["0"].worker_addr.len(), 2);
    // A client query that meets an incomplete table fails at once: vLLM's
    // client does not retry an HTTP error either.
    let s2 = BootstrapServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Some(ExpectedTopology {
            dp_size: 1,
            tp_size: 1,
            pp_size: 1,
        }),
    )
    .await
    .unwrap();
    let t0 = Instant::now();
    let err = client.query(&s2.url()).await.unwrap_err();
    assert!(err.to_string().contains("503"), "{err}");
    assert!(t0.elapsed() < Duration::from_millis(900));
}

#[tokio::test]
async fn client_retries_a_server_that_starts_late() {
    // Reserve a port, release it, and start the server there 1.5 s later.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let server = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        BootstrapServer::start(addr, None).await.unwrap()
    });
    let client = BootstrapClient::new(Duration::from_secs(2), RetryPolicy::default());
    let t0 = Instant::now();
    client
        .register(
            &format!("http://{addr}"),
            &reg("e", 0, 0, "tcp://127.0.0.1:5"),
        )
        .await
        .unwrap();
    // Attempts at ~0 s and ~1 s are refused; the third, after 2 more
    // seconds, succeeds: vLLM's 1 s, 2 s schedule.
    let t = t0.elapsed();
    assert!(
        t >= Duration::from_millis(2900) && t < Duration::from_millis(4500),
        "{t:?}"
    );
    let s = server.await.unwrap();
    assert_eq!(s.table()["0"].engine_id, "e");
}

/// A server that counts requests and answers each one with `status` after
/// `delay`.
async fn scripted(status: StatusCode, delay: Duration) -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let app = Router::new().route(
        "/register",
        post(move || {
            let h = h.clone();
            async move {
                h.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                (status, axum::Json(json!({"detail": "scripted"})))
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (url, hits)
}

#[tokio::test]
async fn client_retries_timeouts_then_fails_instead_of_hanging() {
    let (url, hits) = scripted(StatusCode::OK, Duration::from_secs(30)).await;
    let policy = RetryPolicy {
        attempts: 3,
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(10),
    };
    let client = BootstrapClient::new(Duration::from_millis(300), policy);
    let t0 = Instant::now();
    let err = client
        .register(&url, &reg("e", 0, 0, "tcp://x:1"))
        .await
        .unwrap_err();
    let t = t0.elapsed();
    assert!(
        err.to_string().contains("after 3 attempts") && err.to_string().contains("timed out"),
        "{err}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    // 3 × 300 ms + 100 ms + 200 ms of backoff.
    assert!(
        t >= Duration::from_millis(1150) && t < Duration::from_secs(3),
        "{t:?}"
    );
}

#[tokio::test]
async fn client_does_not_retry_a_4xx() {
    let (url, hits) = scripted(StatusCode::BAD_REQUEST, Duration::ZERO).await;
    let client = BootstrapClient::new(Duration::from_secs(2), RetryPolicy::default());
    let t0 = Instant::now();
    let err = client
        .register(&url, &reg("e", 0, 0, "tcp://x:1"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("400"), "{err}");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert!(t0.elapsed() < Duration::from_millis(900));
}

#[tokio::test]
async fn client_gives_up_on_a_server_that_never_comes() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let policy = RetryPolicy {
        attempts: 3,
        initial_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_secs(10),
    };
    let client = BootstrapClient::new(Duration::from_secs(1), policy);
    let err = client
        .query(&format!("http://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("after 3 attempts") && err.to_string().contains("cannot connect"),
        "{err}"
    );
}

#[tokio::test]
async fn a_port_clash_is_a_startup_error() {
    let s = BootstrapServer::start("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let err = BootstrapServer::start(s.local_addr(), None)
        .await
        .err()
        .expect("second bind fails");
    assert!(
        err.to_string().contains("VLLM_MOONCAKE_BOOTSTRAP_PORT"),
        "{err}"
    );
}

/// What a stand-in bootstrap server received, body by body.
type Seen = Arc<std::sync::Mutex<Vec<Value>>>;

const FIVE: [&str; 5] = ["engine_id", "dp_rank", "tp_rank", "pp_rank", "addr"];

/// Starts `app` on 127.0.0.1 and returns its URL.
async fn stand_in(app: Router) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    url
}

/// A strict older bootstrap server: `/register` takes exactly vLLM's five
/// fields and answers anything else 422 in FastAPI's shape.
async fn older_server() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let app = Router::new().route(
        "/register",
        post(move |axum::Json(body): axum::Json<Value>| {
            let s = s.clone();
            async move {
                s.lock().unwrap().push(body.clone());
                let obj = body.as_object().cloned().unwrap_or_default();
                let extra: Vec<_> = obj
                    .keys()
                    .filter(|k| !FIVE.contains(&k.as_str()))
                    .cloned()
                    .collect();
                let missing = FIVE.iter().any(|k| !obj.contains_key(*k));
                if !extra.is_empty() || missing {
                    let detail: Vec<Value> = extra
                        .iter()
                        .map(|k| {
                            json!({"type": "extra_forbidden", "loc": ["body", k],
                                        "msg": "Extra inputs are not permitted", "input": obj[k]})
                        })
                        .collect();
                    return (
                        StatusCode::UNPROCESSABLE_ENTITY,
                        axum::Json(json!({ "detail": detail })),
                    );
                }
                (StatusCode::OK, axum::Json(json!({"status": "ok"})))
            }
        }),
    );
    (stand_in(app).await, seen)
}

/// vLLM's newer bootstrap server's rule: `tp_size` (default 1) must exceed
/// `tp_rank`, else 400.
async fn newer_server() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let app = Router::new().route(
        "/register",
        post(move |axum::Json(body): axum::Json<Value>| {
            let s = s.clone();
            async move {
                s.lock().unwrap().push(body.clone());
                let tp_size = body["tp_size"].as_u64().unwrap_or(1);
                let tp_rank = body["tp_rank"].as_u64().unwrap_or(0);
                if tp_rank >= tp_size {
                    return (
                        StatusCode::BAD_REQUEST,
                        axum::Json(json!({"detail": format!(
                            "TP rank {tp_rank} must be less than TP size {tp_size}.")})),
                    );
                }
                (StatusCode::OK, axum::Json(json!({"status": "ok"})))
            }
        }),
    );
    (stand_in(app).await, seen)
}

fn tp2_rank(rank: u32) -> RegisterRequest {
    RegisterRequest {
        tp_size: Some(2),
        pp_size: Some(1),
        ..reg("e", 0, rank, &format!("tcp://127.0.0.1:{}", 41000 + rank))
    }
}

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

#[tokio::test]
async fn register_falls_back_to_five_fields_on_a_strict_older_server() {
    let (url, seen) = older_server().await;
    let client = BootstrapClient::new(Duration::from_secs(2), RetryPolicy::default());
    assert!(!client.uses_five_field_body(&url));
    client.register(&url, &tp2_rank(0)).await.unwrap();
    {
        let bodies = seen.lock().unwrap();
        assert_eq!(bodies.len(), 2, "{bodies:?}");
        assert_eq!(bodies[0]["tp_size"], 2, "the newer body goes first");
        let mut five: Vec<String> = FIVE.iter().map(|s| s.to_string()).collect();
        five.sort();
        assert_eq!(keys(&bodies[1]), five);
        assert_eq!(bodies[1]["addr"], "tcp://127.0.0.1:41000");
    }
    // Remembered for that URL (a trailing slash is the same URL), by clones
    // too: the next registration is one five-field POST.
    assert!(client.uses_five_field_body(&format!("{url}/")));
    let clone = client.clone();
    clone
        .register(&format!("{url}/"), &tp2_rank(1))
        .await
        .unwrap();
    {
        let bodies = seen.lock().unwrap();
        assert_eq!(bodies.len(), 3, "{bodies:?}");
        assert!(bodies[2].get("tp_size").is_none(), "{}", bodies[2]);
        assert_eq!(bodies[2]["tp_rank"], 1);
    }
    // A new client starts with the newer body again.
    let fresh = BootstrapClient::new(Duration::from_secs(2), RetryPolicy::default());
    fresh.register(&url, &tp2_rank(1)).await.unwrap();
    assert_eq!(seen.lock().unwrap().len(), 5);
}

#[tokio::test]
async fn register_sends_tp_size_that_a_newer_server_needs() {
    let (url, seen) = newer_server().await;
    let client = BootstrapClient::new(Duration::from_secs(2), RetryPolicy::default());
    client.register(&url, &tp2_rank(0)).await.unwrap();
    client.register(&url, &tp2_rank(1)).await.unwrap();
    {
        let bodies = seen.lock().unwrap();
        assert_eq!(bodies.len(), 2, "one POST each: {bodies:?}");
        assert!(bodies
            .iter()
            .all(|b| b["tp_size"] == 2 && b["pp_size"] == 1));
    }
    assert!(!client.uses_five_field_body(&url));
    // Without tp_size the newer server refuses rank 1 (400, not retried):
    // why the client sends it.
    let t0 = Instant::now();
    let err = client
        .register(&url, &reg("e", 0, 1, "tcp://127.0.0.1:41001"))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("400") && err.to_string().contains("TP size 1"),
        "{err}"
    );
    assert_eq!(seen.lock().unwrap().len(), 3);
    assert!(t0.elapsed() < Duration::from_millis(900));
}

#[tokio::test]
async fn a_422_to_both_bodies_fails_with_both_answers_and_no_more_tries() {
    let (url, hits) = scripted(StatusCode::UNPROCESSABLE_ENTITY, Duration::ZERO).await;
    let client = BootstrapClient::new(Duration::from_secs(2), RetryPolicy::default());
    let err = client.register(&url, &tp2_rank(1)).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("422") && msg.contains("five-field body") && msg.contains(&url),
        "{msg}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    assert!(!client.uses_five_field_body(&url));
    // A five-field registration refused with 422 is not sent again.
    let err = client
        .register(&url, &reg("e", 0, 0, "tcp://127.0.0.1:41000"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("422"), "{err}");
    assert_eq!(hits.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn our_server_takes_the_newer_body_in_one_post() {
    let s = BootstrapServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Some(ExpectedTopology {
            dp_size: 1,
            tp_size: 2,
            pp_size: 1,
        }),
    )
    .await
    .unwrap();
    let live: Vec<_> = (0..2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let client = BootstrapClient::new(Duration::from_secs(2), RetryPolicy::default());
    for (rank, l) in live.iter().enumerate() {
        let req = RegisterRequest {
            tp_size: Some(2),
            pp_size: Some(1),
            ..reg(
                "e",
                0,
                rank as u32,
                &format!("tcp://{}", l.local_addr().unwrap()),
            )
        };
        client.register(&s.url(), &req).await.unwrap();
    }
    assert!(!client.uses_five_field_body(&s.url()));
    assert_eq!(
        client.query(&s.url()).await.unwrap()["0"].worker_addr.len(),
        2
    );
    s.stop().await;
}

/// A bootstrap server is a peer: a table larger than the client's bound
/// (here 6 MiB of padding inside valid JSON) is refused after reading at
/// most that much, with an error naming the bound.
#[tokio::test]
async fn an_oversized_query_answer_is_refused() {
    let big = format!(
        r#"{{"0": {{"engine_id": "{}", "worker_addr": {{}}}}}}"#,
        "x".repeat(6 << 20)
    );
    let app = Router::new().route("/query", axum::routing::get(move || async move { big }));
    let url = stand_in(app).await;
    let client = BootstrapClient::new(Duration::from_secs(5), RetryPolicy::default());
    let err = client.query(&url).await.unwrap_err();
    assert!(err.to_string().contains("larger than"), "{err}");
}
