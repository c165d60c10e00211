//! The optional registration token, what our client sends, and a property
//! test throwing random and mutated bodies at the `/register` parser.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use mooncake_connector::connector::bootstrap::{
    parse_register, BootstrapClient, BootstrapServer, RegisterRequest, RetryPolicy,
};
use proptest::prelude::*;
use serde_json::{json, Value};

fn reg(tp_size: Option<u32>) -> RegisterRequest {
    RegisterRequest {
        engine_id: "e".into(),
        dp_rank: 0,
        tp_rank: 0,
        pp_rank: 0,
        addr: "tcp://127.0.0.1:1".into(),
        tp_size,
        ..Default::default()
    }
}

#[tokio::test]
async fn the_token_is_required_on_register_and_sent_by_our_client() {
    let s = BootstrapServer::start_with_token(
        "127.0.0.1:0".parse().unwrap(),
        None,
        Some("s3cret".into()),
    )
    .await
    .unwrap();
    let url = s.url();
    let plain =
        BootstrapClient::new(Duration::from_secs(2), RetryPolicy::default()).with_token(None);
    let err = plain.register(&url, &reg(Some(1))).await.unwrap_err();
    assert!(err.to_string().contains("401"), "{err}");
    let wrong = BootstrapClient::new(Duration::from_secs(2), RetryPolicy::default())
        .with_token(Some("s3creT".into()));
    assert!(wrong.register(&url, &reg(Some(1))).await.is_err());
    assert!(s.table().is_empty());
    let ok = BootstrapClient::new(Duration::from_secs(2), RetryPolicy::default())
        .with_token(Some("s3cret".into()));
    ok.register(&url, &reg(Some(1))).await.unwrap();
    // /query stays open (decoders need no secret).
    assert_eq!(ok.query(&url).await.unwrap()["0"].engine_id, "e");
}

#[tokio::test]
async fn our_client_sends_the_newer_body_with_tp_size() {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let s2 = seen.clone();
    let app = Router::new().route(
        "/register",
        post(move |axum::Json(v): axum::Json<Value>| {
            let s2 = s2.clone();
            async move {
                s2.lock().unwrap().push(v);
                axum::Json(json!({"status": "ok"}))
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    BootstrapClient::new(Duration::from_secs(2), RetryPolicy::default())
        .register(&url, &reg(Some(2)))
        .await
        .unwrap();
    let v = seen.lock().unwrap()[0].clone();
    assert_eq!(v["tp_size"], 2, "{v}");
    assert_eq!(v["engine_id"], "e");
    assert_eq!(v["addr"], "tcp://127.0.0.1:1");
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,20}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("engine_id".to_string()),
                    Just("dp_rank".to_string()),
                    Just("tp_rank".to_string()),
                    Just("pp_rank".to_string()),
                    Just("addr".to_string()),
                    Just("tp_size".to_string()),
                    ".{0,8}"
                ],
                inner,
                0..7
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_bodies_get_a_4xx_or_a_valid_request(v in json_value(), raw in proptest::collection::vec(any::<u8>(), 0..64)) {
        for bytes in [serde_json::to_vec(&v).unwrap(), raw] {
            match parse_register(&bytes) {
                Ok(r) => prop_assert!(r.engine_id.len() <= bytes.len()),
                Err((code, answer)) => {
                    prop_assert!(code == 400 || code == 422, "{code}");
                    if code == 422 {
                        let d = answer["detail"].as_array().expect("a list");
                        prop_assert!(!d.is_empty());
                        for e in d {
                            prop_assert!(e["type"].is_string() && e["msg"].is_string() && e["loc"].is_array());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn lax_ints_as_pydantic(n in 0u32..1_000_000) {
        let b = json!({"engine_id": "e", "dp_rank": n.to_string(), "tp_rank": f64::from(n), "pp_rank": n, "addr": "tcp://h:1"});
        let r = parse_register(&serde_json::to_vec(&b).unwrap()).unwrap();
        prop_assert_eq!((r.dp_rank, r.tp_rank, r.pp_rank), (n, n, n));
    }
}
