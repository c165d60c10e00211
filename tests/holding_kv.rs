//! A prefill worker never holds its capacity (or KV) for nobody: pulls for
//! transfer ids it has never heard of are answered with an error after a
//! short grace that holds no handler slot.
mod pd;

use std::time::{Duration, Instant};

use mooncake_connector::sim::model::tokenize;
use pd::{all_ok, env, req, spec, Decode, Prefill};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_pulls_do_not_starve_a_real_pull() {
    // A long abort timeout: unknown ids must not wait for it.
    let p = Prefill::start(1, spec(), env(120)).await;
    let d = Decode::start(1, spec(), env(120));
    let (url, id) = (p.bootstrap_url(), p.engine_id.clone());
    // More unknown pulls than a vLLM worker has handler tasks (2 × 10).
    let flood = futures::future::join_all((0..40).map(|i| {
        let (d, url, id) = (&d, url.clone(), id.clone());
        async move {
            let t0 = Instant::now();
            let out = d
                .pull(
                    &url,
                    &id,
                    vec![req(&format!("d-u{i}"), &format!("xfer-unknown-{i}"), &[1])],
                )
                .await;
            (out, t0.elapsed())
        }
    }));
    let real = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let tokens = tokenize("a real request among the flood");
        p.prefill("xfer-real", "p-real", &tokens, &[1, 2]);
        let t0 = Instant::now();
        let out = tokio::time::timeout(
            Duration::from_secs(20),
            d.pull(&url, &id, vec![req("d-real", "xfer-real", &[7, 8])]),
        )
        .await
        .expect("the real pull was starved by unknown ones");
        all_ok(&out, &["d-real"]);
        d.verify(&tokens, &[7, 8]).unwrap();
        t0.elapsed()
    };
    let (flooded, real_took) = tokio::join!(flood, real);
    assert!(real_took < Duration::from_secs(3), "{real_took:?}");
    for (out, took) in flooded {
        let why = &out[0].failed[0].1;
        assert!(why.contains("unknown"), "{why}");
        // The default grace for unknown ids is 5 s.
        assert!(took < Duration::from_secs(9), "{took:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_for_a_started_request_waits_for_it() {
    let p = Prefill::start(1, spec(), env(30)).await;
    let d = Decode::start(1, spec(), env(30));
    // The engine admitted the request; its prefill takes longer than the
    // grace for unknown ids.
    p.connector.request_started("xfer-slow");
    let tokens = tokenize("a slow prefill");
    let url = p.bootstrap_url();
    let pull = d.pull(&url, &p.engine_id, vec![req("d-s", "xfer-slow", &[3])]);
    let finish = async {
        tokio::time::sleep(Duration::from_secs(6)).await;
        p.prefill("xfer-slow", "p-slow", &tokens, &[5]);
    };
    let (out, ()) = tokio::join!(pull, finish);
    all_ok(&out, &["d-s"]);
}
