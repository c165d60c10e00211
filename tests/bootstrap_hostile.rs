//! The bootstrap server under careless and hostile clients: no poisoning of
//! live entries, bounded bodies, ids, addresses, ranks and table, and the
//! answers a vLLM client can observe (FastAPI's shapes).
use mooncake_connector::connector::bootstrap::{BootstrapServer, ExpectedTopology};
use serde_json::{json, Value};

async fn post_json(url: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{url}/register"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn query(url: &str) -> (u16, String) {
    let r = reqwest::get(format!("{url}/query")).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn body(engine: &str, dp: u64, tp: u64, addr: &str) -> Value {
    json!({"engine_id": engine, "dp_rank": dp, "tp_rank": tp, "pp_rank": 0, "addr": addr})
}

#[tokio::test]
async fn a_live_entry_cannot_be_poisoned_and_a_restarted_worker_re_registers() {
    let s = BootstrapServer::start("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let url = s.url();
    let live = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = format!("tcp://{}", live.local_addr().unwrap());
    // Our client announces tp_size.
    let mut first = body("e1", 0, 0, &a);
    first["tp_size"] = json!(1);
    assert_eq!(post_json(&url, &first).await.0, 200);
    let (_, before) = query(&url).await;
    // tp_rank 1 for an engine that announced TP 1.
    let (code, b) = post_json(&url, &body("e1", 0, 1, "tcp://127.0.0.1:9")).await;
    assert!((400..500).contains(&code), "{code} {b}");
    assert!(b["detail"].as_str().unwrap().contains("tp_size=1"), "{b}");
    // Another TP size.
    let mut other = body("e1", 0, 0, &a);
    other["tp_size"] = json!(2);
    assert_eq!(post_json(&url, &other).await.0, 400);
    // Another address for the live worker's slot.
    let (code, b) = post_json(&url, &body("e1", 0, 0, "tcp://127.0.0.1:9")).await;
    assert_eq!(code, 400, "{b}");
    assert!(b["detail"].as_str().unwrap().contains("still alive"), "{b}");
    assert_eq!(query(&url).await.1, before, "nothing changed");
    // The worker restarts on another port: its old side channel is gone,
    // so the same slot (engine id, ranks, sizes) may move.
    drop(live);
    let fresh = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let b2 = format!("tcp://{}", fresh.local_addr().unwrap());
    let mut again = body("e1", 0, 0, &b2);
    again["tp_size"] = json!(1);
    let (code, b) = post_json(&url, &again).await;
    assert_eq!(code, 200, "{b}");
    assert!(query(&url).await.1.contains(&b2));
}

#[tokio::test]
async fn ids_addresses_ranks_bodies_and_the_table_are_bounded() {
    let s = BootstrapServer::start("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let url = s.url();
    // A 1 MiB engine id: the body is refused before it is parsed.
    let huge = "x".repeat(1 << 20);
    let (code, _) = post_json(&url, &body(&huge, 0, 0, "tcp://127.0.0.1:1")).await;
    assert_eq!(code, 413);
    // Ids and addresses are checked.
    for (engine, addr) in [
        ("e/../x", "tcp://127.0.0.1:1"),
        ("", "tcp://127.0.0.1:1"),
        (&"e".repeat(200), "tcp://127.0.0.1:1"),
        ("e", "http://127.0.0.1:1"),
        ("e", "tcp://127.0.0.1:0"),
        ("e", "tcp://127.0.0.1:99999"),
        ("e", "tcp://127.0.0.1"),
        ("e", "tcp://bad host:1"),
    ] {
        let (code, b) = post_json(&url, &body(engine, 0, 0, addr)).await;
        assert_eq!(code, 400, "{engine:.20} {addr}: {b}");
    }
    // Ranks below their sizes.
    let mut b = body("e", 0, 3, "tcp://127.0.0.1:1");
    b["tp_size"] = json!(2);
    assert_eq!(post_json(&url, &b).await.0, 400);
    let (code, _) = post_json(&url, &body("e", 0, 5000, "tcp://127.0.0.1:1")).await;
    assert_eq!(code, 400);
    // DP ranks bounded by the announced DP size.
    let mut b = body("d0", 0, 0, "tcp://127.0.0.1:1");
    b["dp_size"] = json!(2);
    assert_eq!(post_json(&url, &b).await.0, 200);
    assert_eq!(
        post_json(&url, &body("d1", 1, 0, "tcp://127.0.0.1:2"))
            .await
            .0,
        200
    );
    let (code, b) = post_json(&url, &body("d2", 2, 0, "tcp://127.0.0.1:3")).await;
    assert_eq!(code, 400, "{b}");
    // A server without announced sizes still bounds its table.
    let s2 = BootstrapServer::start("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let mut accepted = 0;
    for dp in 0..1000u64 {
        let (code, _) = post_json(
            &s2.url(),
            &body(&format!("e{dp}"), dp, 0, "tcp://127.0.0.1:1"),
        )
        .await;
        if code == 200 {
            accepted += 1;
        } else {
            assert_eq!(code, 400);
        }
    }
    assert!(accepted <= 256, "{accepted}");
    let (code, table) = query(&s2.url()).await;
    assert_eq!(code, 200);
    assert!(table.len() < 64 * 1024, "{}", table.len());
}

#[tokio::test]
async fn a_server_with_an_expected_topology_refuses_ranks_outside_it() {
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
    for (dp, tp) in [(1, 0), (0, 2), (999, 0)] {
        let (code, b) = post_json(&s.url(), &body("e", dp, tp, "tcp://127.0.0.1:1")).await;
        assert_eq!(code, 400, "dp {dp} tp {tp}: {b}");
    }
}

#[tokio::test]
async fn answers_match_vllms_fastapi_server() {
    let s = BootstrapServer::start("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let url = s.url();
    // pydantic's lax mode: "0" is an int.
    let (code, b) = post_json(
        &url,
        &json!({"engine_id": "e", "dp_rank": "0", "tp_rank": "0", "pp_rank": 0, "addr": "tcp://127.0.0.1:1"}),
    )
    .await;
    assert_eq!(code, 200, "{b}");
    // An identical re-registration is accepted (a retried request).
    let (code, _) = post_json(&url, &body("e", 0, 0, "tcp://127.0.0.1:1")).await;
    assert_eq!(code, 200);
    // Validation errors: 422 with a list of {type, loc, msg}.
    let (code, b) = post_json(
        &url,
        &json!({"engine_id": "e", "dp_rank": "zero", "tp_rank": 0}),
    )
    .await;
    assert_eq!(code, 422);
    let detail = b["detail"].as_array().expect("detail is a list");
    let locs: Vec<&Value> = detail.iter().map(|d| &d["loc"]).collect();
    assert!(locs.contains(&&json!(["body", "dp_rank"])), "{b}");
    assert!(locs.contains(&&json!(["body", "pp_rank"])), "{b}");
    assert!(locs.contains(&&json!(["body", "addr"])), "{b}");
    for d in detail {
        assert!(d["type"].is_string() && d["msg"].is_string(), "{d}");
    }
    let dp = detail
        .iter()
        .find(|d| d["loc"] == json!(["body", "dp_rank"]))
        .unwrap();
    assert_eq!(dp["type"], "int_parsing");
    let pp = detail
        .iter()
        .find(|d| d["loc"] == json!(["body", "pp_rank"]))
        .unwrap();
    assert_eq!(
        (pp["type"].as_str(), pp["msg"].as_str()),
        (Some("missing"), Some("Field required"))
    );
    let r = reqwest::Client::new()
        .post(format!("{url}/register"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["detail"][0]["type"], "json_invalid");
    // GET /register: 405 with FastAPI's body and Allow header.
    let r = reqwest::get(format!("{url}/register")).await.unwrap();
    assert_eq!(r.status().as_u16(), 405);
    assert_eq!(r.headers()["allow"], "POST");
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"detail": "Method Not Allowed"})
    );
    let r = reqwest::get(format!("{url}/nothing")).await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"detail": "Not Found"})
    );
}
