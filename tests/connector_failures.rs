//! Every failure path of the connector, with a short abort timeout: each
//! ends with a clear result on both sides, and none hangs.
mod pd;

use std::time::{Duration, Instant};

use bytes::Bytes;
use mooncake_connector::connector::protocol::{
    decode, encode, XferMetadata, XferResponse, XferStatus,
};
use mooncake_connector::connector::regions::KvLayout;
use mooncake_connector::connector::ProducerEvent;
use mooncake_connector::sim::model::tokenize;
use pd::{all_ok, env, req, spec, Decode, Prefill};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_side_abort_fails_the_pull_at_once() {
    let mut p = Prefill::start(1, spec(), env(2)).await;
    let d = Decode::start(1, spec(), env(2));
    p.abort("xfer-a");
    let t0 = Instant::now();
    let out = d
        .pull(
            &p.bootstrap_url(),
            &p.engine_id,
            vec![req("d-a", "xfer-a", &[1, 2])],
        )
        .await;
    assert!(out[0].ok.is_empty());
    assert!(out[0].failed[0].1.contains("aborted"), "{out:?}");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    // A pull that was already waiting when the abort came fails too.
    let url = p.bootstrap_url();
    let id = p.engine_id.clone();
    let pull = d.pull(&url, &id, vec![req("d-b", "xfer-b", &[3])]);
    let abort = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        p.abort("xfer-b");
    };
    let (out, ()) = tokio::join!(pull, abort);
    assert!(out[0].failed[0].1.contains("aborted"), "{out:?}");
    assert_eq!(
        p.next_event(Duration::from_millis(100)).await,
        None,
        "nothing to free: the engine freed it on abort"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decoder_abort_before_scheduling_releases_prefill_blocks() {
    let mut p = Prefill::start(1, spec(), env(2)).await;
    let d = Decode::start(1, spec(), env(2));
    p.prefill(
        "xfer-r",
        "p-r",
        &tokenize("abandoned by the decoder"),
        &[1, 2, 3, 4, 5, 6],
    );
    // An empty pull: "release, I will not pull this".
    let out = d
        .pull(
            &p.bootstrap_url(),
            &p.engine_id,
            vec![req("d-r", "xfer-r", &[])],
        )
        .await;
    all_ok(&out, &["d-r"]);
    match p.next_event(Duration::from_secs(1)).await {
        Some(ProducerEvent::FinishedSending { p_req_id, .. }) => assert_eq!(p_req_id, "p-r"),
        other => panic!("expected the release to finish the slot, got {other:?}"),
    }
    assert_eq!(p.stats.snapshot().released_slots, 1);
    assert_eq!(p.stats.snapshot().bytes_sent, 0);
    // Released before the prefill finished: the slot ends when it is ready.
    let out = d
        .pull(
            &p.bootstrap_url(),
            &p.engine_id,
            vec![req("d-e", "xfer-early", &[])],
        )
        .await;
    all_ok(&out, &["d-e"]);
    assert_eq!(p.next_event(Duration::from_millis(200)).await, None);
    p.prefill(
        "xfer-early",
        "p-early",
        &tokenize("late prefill"),
        &[9, 10, 11],
    );
    assert!(matches!(p.next_event(Duration::from_secs(1)).await,
        Some(ProducerEvent::FinishedSending { p_req_id, .. }) if p_req_id == "p-early"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decoder_that_never_pulls_expires_after_the_abort_timeout() {
    let mut p = Prefill::start(1, spec(), env(1)).await;
    p.prefill(
        "xfer-x",
        "p-x",
        &tokenize("nobody wants this"),
        &[1, 2, 3, 4, 5],
    );
    let t0 = Instant::now();
    match p.next_event(Duration::from_secs(5)).await {
        Some(ProducerEvent::Expired {
            p_req_id,
            transfer_id,
        }) => {
            assert_eq!((p_req_id.as_str(), transfer_id.as_str()), ("p-x", "xfer-x"))
        }
        other => panic!("expected expiry, got {other:?}"),
    }
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    assert_eq!(p.stats.snapshot().expired_slots, 1);
    assert_eq!(p.producer(0).slots(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_that_never_comes_times_out_the_pull() {
    let p = Prefill::start(1, spec(), env(1)).await;
    let d = Decode::start(1, spec(), env(1));
    let t0 = Instant::now();
    let out = d
        .pull(
            &p.bootstrap_url(),
            &p.engine_id,
            vec![req("d-t", "xfer-never", &[1])],
        )
        .await;
    assert!(
        out[0].failed[0]
            .1
            .contains("Timeout waiting for P side ready."),
        "{out:?}"
    );
    assert!(t0.elapsed() >= Duration::from_millis(900) && t0.elapsed() < Duration::from_secs(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_write_failure_reports_the_engine_error() {
    // The decoder advertises KV regions 1 TiB away from its real memory: the
    // decoder's engine rejects the prefiller's writes.
    let mut p = Prefill::start(1, spec(), env(1)).await;
    let mut d = Decode::start(1, spec(), env(1));
    let (ctx, consumer) = d.ranks.remove(0);
    drop(consumer);
    let Ok(mut ctx) = std::sync::Arc::try_unwrap(ctx) else {
        panic!("context still shared")
    };
    for r in &mut ctx.layout.regions {
        r.base += 1 << 40;
    }
    let consumer = mooncake_connector::connector::Consumer::new(std::sync::Arc::new(ctx));
    p.prefill(
        "xfer-w",
        "p-w",
        &tokenize("this write will be refused"),
        &[1, 2, 3, 4, 5, 6, 7],
    );
    let out = consumer
        .pull(
            &p.bootstrap_url(),
            &p.engine_id,
            vec![req("d-w", "xfer-w", &[1, 2, 3, 4, 5, 6, 7])],
        )
        .await;
    let why = &out.failed[0].1;
    assert!(why.contains("rejected"), "{why}");
    assert_eq!(p.stats.snapshot().transfers_failed, 1);
    // Not counted as sent: the expiry sweep frees the prefill blocks.
    assert!(matches!(
        p.next_event(Duration::from_secs(4)).await,
        Some(ProducerEvent::Expired { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_engine_id_fails_without_waiting() {
    let p = Prefill::start(1, spec(), env(30)).await;
    let d = Decode::start(1, spec(), env(30));
    let t0 = Instant::now();
    let out = d
        .pull(
            &p.bootstrap_url(),
            "no-such-engine",
            vec![req("d-u", "xfer-u", &[1])],
        )
        .await;
    assert!(
        out[0].failed[0]
            .1
            .contains("remote engine_id no-such-engine not found from bootstrap server"),
        "{out:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert_eq!(d.stats.snapshot().pulls_failed, 1);
}

/// Sends one raw pull message and collects the replies until FINISH/ERROR.
async fn raw_pull(addr: &str, meta: &XferMetadata) -> Vec<XferResponse> {
    let mut s = zeromq::DealerSocket::new();
    s.connect(addr).await.unwrap();
    s.send(ZmqMessage::from(Bytes::from(encode(meta))))
        .await
        .unwrap();
    let mut out = Vec::new();
    loop {
        let m = tokio::time::timeout(Duration::from_secs(10), s.recv())
            .await
            .expect("reply")
            .unwrap();
        let r: XferResponse = decode("response", m.into_vec().last().unwrap()).unwrap();
        let done = r.status != XferStatus::Continue;
        out.push(r);
        if done {
            return out;
        }
    }
}

fn metadata_for(d: &Decode, rank: usize, reqs: &[(&str, &str, &[u64])]) -> XferMetadata {
    let (ctx, _) = &d.ranks[rank];
    let mut m = XferMetadata {
        remote_hostname: "127.0.0.1".into(),
        remote_port: ctx.engine.rpc_port() as u64,
        remote_tp_size: 0,
        remote_tp_rank: 0,
        req_blocks: reqs
            .iter()
            .map(|(d, t, b)| (d.to_string(), (t.to_string(), vec![b.to_vec()])))
            .collect(),
        kv_caches_base_addr: vec![],
        block_lens: vec![],
        kv_block_lens: vec![],
        registered_layer_names: vec![],
        registered_layer_indices: vec![],
        registered_group_indices: vec![],
        remote_pp_size: 1,
    };
    let layout: &KvLayout = &ctx.layout;
    layout.fill_metadata(&mut m);
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpaired_rank_and_bad_layout_get_error_replies() {
    let p = Prefill::start(2, spec(), env(30)).await;
    let d = Decode::start(2, spec(), env(30));
    // Decode rank 1 talks to prefill rank 0, which serves decode rank 0 only.
    let m = metadata_for(&d, 1, &[("d-1", "xfer-1", &[1])]);
    let replies = raw_pull(p.producer(0).side_channel_addr(), &m).await;
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].status, XferStatus::Error);
    assert!(
        replies[0]
            .err_msg
            .as_deref()
            .unwrap()
            .contains("D tp_rank 1 is not paired with P tp_rank 0"),
        "{replies:?}"
    );
    // A layer the prefiller does not have.
    let mut m = metadata_for(&d, 0, &[("d-1", "xfer-1", &[1])]);
    m.registered_layer_names[1] = "model.layers.99.self_attn.attn".into();
    let r = raw_pull(p.producer(0).side_channel_addr(), &m).await;
    assert_eq!(r[0].status, XferStatus::Error);
    assert!(
        r[0].err_msg.as_deref().unwrap().contains("missing"),
        "{r:?}"
    );
    // Garbage instead of msgpack.
    let mut s = zeromq::DealerSocket::new();
    s.connect(p.producer(0).side_channel_addr()).await.unwrap();
    s.send(ZmqMessage::from(Bytes::from_static(
        b"\xc1\xc1 not msgpack",
    )))
    .await
    .unwrap();
    let m = tokio::time::timeout(Duration::from_secs(5), s.recv())
        .await
        .unwrap()
        .unwrap();
    let r: XferResponse = decode("response", m.into_vec().last().unwrap()).unwrap();
    assert_eq!(r.status, XferStatus::Error);
    assert!(r.err_msg.unwrap().contains("MooncakeXferMetadata"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_then_finish_as_requests_become_ready() {
    let p = Prefill::start(1, spec(), env(30)).await;
    let d = Decode::start(1, spec(), env(30));
    let (ta, tb) = (
        tokenize("ready right away"),
        tokenize("ready a little later"),
    );
    p.prefill("xfer-a", "p-a", &ta, &[1, 2, 3, 4]);
    let m = metadata_for(
        &d,
        0,
        &[
            ("d-a", "xfer-a", &[10, 11, 12, 13]),
            ("d-b", "xfer-b", &[20, 21, 22, 23, 24]),
        ],
    );
    let addr = p.producer(0).side_channel_addr().to_string();
    let later = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        p.prefill("xfer-b", "p-b", &tb, &[5, 6, 7, 8, 9]);
    };
    let (replies, ()) = tokio::join!(raw_pull(&addr, &m), later);
    assert_eq!(replies.len(), 2, "{replies:?}");
    assert_eq!(replies[0].status, XferStatus::Continue);
    assert_eq!(
        replies[0].ok_reqs.as_deref(),
        Some(&["d-a".to_string()][..])
    );
    assert_eq!(replies[1].status, XferStatus::Finish);
    assert_eq!(
        replies[1].ok_reqs.as_deref(),
        Some(&["d-b".to_string()][..])
    );
    d.verify(&ta, &[10, 11, 12, 13]).unwrap();
    d.verify(&tb, &[20, 21, 22, 23, 24]).unwrap();
}
