//! The connector moving real KV between in-process prefill and decode
//! workers: equal and heterogeneous TP, decoder-first ordering, partial
//! prefixes, and the completion accounting.
mod pd;

use std::time::Duration;

use mooncake_connector::connector::ProducerEvent;
use mooncake_connector::sim::model::ModelSpec;
use mooncake_connector::sim::model::{expected_digest, tokenize};
use pd::{all_ok, env, req, spec, Decode, Prefill};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_tp_two_requests_in_one_pull() {
    let mut p = Prefill::start(1, spec(), env(30)).await;
    let d = Decode::start(1, spec(), env(30));
    let (t1, t2) = (
        tokenize("the quick brown fox jumps"),
        tokenize("over the lazy dog, twice over"),
    );
    p.prefill("xfer-1", "p-1", &t1, &[3, 4, 5, 6, 7, 8, 9]);
    p.prefill("xfer-2", "p-2", &t2, &[20, 21, 22, 23, 24, 25, 26, 27]);
    let out = d
        .pull(
            &p.bootstrap_url(),
            &p.engine_id,
            vec![
                req("d-1", "xfer-1", &[10, 11, 12, 13, 14, 15, 16]),
                req("d-2", "xfer-2", &[40, 41, 50, 51, 52, 60, 61, 62]),
            ],
        )
        .await;
    all_ok(&out, &["d-1", "d-2"]);
    assert_eq!(
        d.verify(&t1, &[10, 11, 12, 13, 14, 15, 16]).unwrap(),
        expected_digest(&spec(), &t1)
    );
    assert_eq!(
        d.verify(&t2, &[40, 41, 50, 51, 52, 60, 61, 62]).unwrap(),
        expected_digest(&spec(), &t2)
    );
    // Both slots finished after the single decoder pulled them.
    let mut finished = vec![];
    for _ in 0..2 {
        match p.next_event(Duration::from_secs(5)).await {
            Some(ProducerEvent::FinishedSending { p_req_id, .. }) => finished.push(p_req_id),
            other => panic!("expected FinishedSending, got {other:?}"),
        }
    }
    finished.sort();
    assert_eq!(finished, ["p-1", "p-2"]);
    let s = p.stats.snapshot();
    assert_eq!(s.transfers_ok, 2);
    // Contiguous runs are coalesced: d-1 is one run (7 blocks) per layer;
    // d-2 has dst runs [40,41],[50..52],[60..62] against src 20..27.
    assert_eq!(s.descriptors_sent, 3 + 3 * 3);
    assert_eq!(s.bytes_sent, (7 + 8) * 3 * spec().kv_block_len(1) as u64);
    assert_eq!(d.stats.snapshot().pulls_ok, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decoder_asks_before_prefill_finishes() {
    let p = Prefill::start(1, spec(), env(30)).await;
    let d = Decode::start(1, spec(), env(30));
    let tokens = tokenize("decoder first, prefill later");
    let url = p.bootstrap_url();
    let engine_id = p.engine_id.clone();
    let pull = d.pull(
        &url,
        &engine_id,
        vec![req("d-1", "xfer-late", &[1, 2, 3, 4, 5, 6, 7, 8])],
    );
    let prefill = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        p.prefill(
            "xfer-late",
            "p-late",
            &tokens,
            &[30, 31, 32, 33, 34, 35, 36, 37],
        );
    };
    let (out, ()) = tokio::join!(pull, prefill);
    all_ok(&out, &["d-1"]);
    d.verify(&tokens, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_prefix_sends_only_the_tail() {
    let p = Prefill::start(1, spec(), env(30)).await;
    let d = Decode::start(1, spec(), env(30));
    let tokens = tokenize("0123456789abcdefghijklmnopqrstuv"); // 32 tokens, 8 blocks
    p.prefill("xfer-pp", "p-pp", &tokens, &[0, 1, 2, 3, 4, 5, 6, 7]);
    // The decoder has the first 5 blocks cached; it asks for the last 3.
    let out = d
        .pull(
            &p.bootstrap_url(),
            &p.engine_id,
            vec![req("d-pp", "xfer-pp", &[50, 51, 52])],
        )
        .await;
    all_ok(&out, &["d-pp"]);
    let ctx = &d.ranks[0].0;
    let mut got = vec![0u8; spec().kv_block_len(1)];
    let mut want = got.clone();
    for layer in 0..spec().layers {
        for (i, dst) in [50u64, 51, 52].iter().enumerate() {
            ctx.kv
                .read_at(ctx.block_offset(layer, *dst), &mut got)
                .unwrap();
            mooncake_connector::sim::model::fill_block(
                &spec(),
                1,
                0,
                layer,
                &tokens,
                5 + i,
                &mut want,
            );
            assert_eq!(got, want, "layer {layer} block {dst}");
        }
    }
    // The decoder asking for more blocks than the prefill has is an error.
    p.prefill("xfer-short", "p-short", &tokens[..8], &[9, 10]);
    let out = d
        .pull(
            &p.bootstrap_url(),
            &p.engine_id,
            vec![req("d-s", "xfer-short", &[1, 2, 3])],
        )
        .await;
    assert!(
        out[0].failed[0].1.contains("P num blocks less than D"),
        "{out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_tp2_to_decode_tp1() {
    let mut p = Prefill::start(2, spec(), env(30)).await;
    let d = Decode::start(1, spec(), env(30));
    let tokens = tokenize("two prefill ranks write halves of each decode block");
    let blocks: Vec<u64> = (0..spec().blocks_for(tokens.len()) as u64).collect();
    p.prefill("xfer-21", "p-21", &tokens, &blocks);
    let dst: Vec<u64> = blocks.iter().map(|b| b + 20).collect();
    let out = d
        .pull(
            &p.bootstrap_url(),
            &p.engine_id,
            vec![req("d-21", "xfer-21", &dst)],
        )
        .await;
    all_ok(&out, &["d-21"]);
    assert_eq!(
        d.verify(&tokens, &dst).unwrap(),
        expected_digest(&spec(), &tokens)
    );
    // Each prefill rank serves the one decode rank: both finish.
    for _ in 0..2 {
        assert!(matches!(
            p.next_event(Duration::from_secs(5)).await,
            Some(ProducerEvent::FinishedSending { .. })
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_tp1_to_decode_tp2_needs_both_pulls() {
    let mut p = Prefill::start(1, spec(), env(30)).await;
    let d = Decode::start(2, spec(), env(30));
    let tokens = tokenize("one prefill rank, two decode ranks, each gets its heads");
    let blocks: Vec<u64> = (0..spec().blocks_for(tokens.len()) as u64).collect();
    p.prefill("xfer-12", "p-12", &tokens, &blocks);
    let dst: Vec<u64> = blocks.iter().map(|b| b + 7).collect();
    // Rank 0 pulls alone first: the slot is not finished (need_send = 2).
    let first = d.ranks[0]
        .1
        .pull(
            &p.bootstrap_url(),
            &p.engine_id,
            vec![req("d-12", "xfer-12", &dst)],
        )
        .await;
    assert_eq!(first.ok, ["d-12"]);
    assert_eq!(p.next_event(Duration::from_millis(300)).await, None);
    assert_eq!(p.producer(0).slots(), 1);
    let second = d.ranks[1]
        .1
        .pull(
            &p.bootstrap_url(),
            &p.engine_id,
            vec![req("d-12", "xfer-12", &dst)],
        )
        .await;
    assert_eq!(second.ok, ["d-12"]);
    assert!(matches!(
        p.next_event(Duration::from_secs(5)).await,
        Some(ProducerEvent::FinishedSending { p_req_id, .. }) if p_req_id == "p-12"
    ));
    assert_eq!(
        d.verify(&tokens, &dst).unwrap(),
        expected_digest(&spec(), &tokens)
    );
}

/// The producer's bookkeeping stays linear in descriptors: a scattered
/// pull of 2,000 blocks over 3 layers (6,000 descriptors, one per block
/// and layer) reads each descriptor's status once. Before this guard the
/// producer read the statuses of `0..=i` for every descriptor `i`
/// (18 million reads here), which made 32k-token scattered pulls 10x slower
/// than contiguous ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scattered_pull_reads_each_status_once() {
    const BLOCKS: u64 = 2_000;
    let spec = ModelSpec {
        num_blocks: 2 * BLOCKS as usize + 2,
        ..spec()
    };
    let mut p = Prefill::start(1, spec, env(30)).await;
    let d = Decode::start(1, spec, env(30));
    let tokens: Vec<u32> = (0..BLOCKS as u32 * spec.block_size as u32)
        .map(|i| i % 97)
        .collect();
    let src: Vec<u64> = (0..BLOCKS).collect();
    // Every other decode block: no two neighbours, so nothing coalesces.
    let dst: Vec<u64> = (0..BLOCKS).map(|b| 2 * b + 1).collect();
    let engine = &p.ctx(0).engine;
    let before = engine.counters().unwrap();
    p.prefill("xfer-s", "p-s", &tokens, &src);
    let out = d
        .pull(
            &p.bootstrap_url(),
            &p.engine_id,
            vec![req("d-s", "xfer-s", &dst)],
        )
        .await;
    all_ok(&out, &["d-s"]);
    assert!(matches!(
        p.next_event(Duration::from_secs(10)).await,
        Some(ProducerEvent::FinishedSending { .. })
    ));
    assert_eq!(
        d.verify(&tokens, &dst).unwrap(),
        expected_digest(&spec, &tokens)
    );
    let after = p.ctx(0).engine.counters().unwrap();
    let descriptors = BLOCKS * spec.layers as u64;
    assert_eq!(p.stats.snapshot().descriptors_sent, descriptors);
    assert_eq!(after.tasks_submitted - before.tasks_submitted, descriptors);
    let reads = after.task_status_reads - before.task_status_reads;
    assert!(
        reads <= descriptors,
        "{reads} status reads for {descriptors} descriptors: bookkeeping is no longer linear"
    );
}

/// `kv_connector_extra_config.metadata_server`: both sides publish
/// themselves in an HTTP metadata store (this package's server, in
/// process) under `"<host>:<handshake port>"`, and the prefiller finds the
/// decoder there, not by a handshake to the address in the side channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_through_a_metadata_store() {
    use mooncake_connector::metadata_server::{serve, Config};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let store = format!("http://{}/metadata", listener.local_addr().unwrap());
    tokio::spawn(serve(listener, Config::default(), std::future::pending()));
    let extra =
        format!(r#"{{"mooncake_protocol":"tcp","num_workers":2,"metadata_server":"{store}"}}"#);
    let p = Prefill::start_with(1, spec(), env(30), &extra).await;
    let d = Decode::start_with(1, spec(), env(30), &extra);
    let name = |ctx: &mooncake_connector::connector::WorkerContext| {
        format!("127.0.0.1:{}", ctx.engine.rpc_port())
    };
    let get = |key: String| {
        let url = format!("{store}?key={key}");
        async move {
            let r = reqwest::get(url).await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    // The decoder's descriptor and handshake address are in the store under
    // the name the side channel carries.
    let (dname, pname) = (name(&d.ranks[0].0), name(p.ctx(0)));
    assert_eq!(d.ranks[0].0.engine.segment_name(), dname);
    for key in [
        format!("mooncake/ram/{dname}"),
        format!("mooncake/rpc_meta/{pname}"),
    ] {
        let (status, body) = get(key.clone()).await;
        assert_eq!(status, 200, "{key}: {body}");
    }
    let tokens = tokenize("a store between prefill and decode");
    p.prefill("xfer-s", "p-s", &tokens, &[5, 6, 7, 8, 9, 10, 11, 12, 13]);
    let blocks = [30, 31, 32, 40, 41, 42, 43, 50, 51];
    let out = d
        .pull(
            &p.bootstrap_url(),
            &p.engine_id,
            vec![req("d-s", "xfer-s", &blocks)],
        )
        .await;
    all_ok(&out, &["d-s"]);
    assert_eq!(
        d.verify(&tokens, &blocks).unwrap(),
        expected_digest(&spec(), &tokens)
    );
    // Shutdown withdraws both entries.
    drop(d);
    let (status, _) = get(format!("mooncake/ram/{dname}")).await;
    assert_eq!(status, 404);
}
