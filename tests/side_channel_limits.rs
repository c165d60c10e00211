//! The side channel under hostile peers: frames announcing absurd sizes
//! drop the peer (nothing is allocated), and the worker keeps serving.
mod pd;

use std::time::{Duration, Instant};

use mooncake_connector::connector::bootstrap::{
    BootstrapClient, BootstrapServer, RegisterRequest, RetryPolicy,
};
use mooncake_connector::sim::model::tokenize;
use pd::{all_ok, env, req, spec, Decode, Prefill};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn greeting() -> Vec<u8> {
    let mut g = vec![0u8; 64];
    g[0] = 0xff;
    g[9] = 0x7f;
    g[10] = 3;
    g[11] = 1;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// A READY command for `socket_type`.
fn ready(socket_type: &str) -> Vec<u8> {
    let mut body = vec![5u8];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    body.extend_from_slice(socket_type.as_bytes());
    let mut f = vec![0x04, body.len() as u8];
    f.extend_from_slice(&body);
    f
}

fn huge_frame(size: u64) -> Vec<u8> {
    let mut f = vec![0x02];
    f.extend_from_slice(&size.to_be_bytes());
    f
}

/// Reads until the peer closes; true if it did within `within`.
async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_frame_drops_the_peer_and_the_prefill_keeps_serving() {
    let p = Prefill::start(1, spec(), env(5)).await;
    let addr = p
        .producer(0)
        .side_channel_addr()
        .trim_start_matches("tcp://")
        .to_string();
    for size in [1u64 << 62, u64::MAX, 1 << 34] {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(&greeting()).await.unwrap();
        s.write_all(&ready("DEALER")).await.unwrap();
        s.write_all(&huge_frame(size)).await.unwrap();
        let _ = s.write_all(&[0u8; 1024]).await;
        assert!(
            closed_within(&mut s, Duration::from_secs(5)).await,
            "a peer announcing a {size}-byte frame was not dropped"
        );
    }
    // Garbage instead of a greeting is dropped too.
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(5)).await);
    // A real pull still works.
    let d = Decode::start(1, spec(), env(5));
    let tokens = tokenize("still serving after the attack");
    p.prefill("xfer-ok", "p-ok", &tokens, &[1, 2]);
    let out = d
        .pull(
            &p.bootstrap_url(),
            &p.engine_id,
            vec![req("d-ok", "xfer-ok", &[4, 5])],
        )
        .await;
    all_ok(&out, &["d-ok"]);
    d.verify(&tokens, &[4, 5]).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_prefiller_cannot_make_the_decoder_allocate() {
    // A fake prefill worker that answers every pull with a 2^62-byte frame.
    let fake = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake_addr = fake.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = fake.accept().await {
            tokio::spawn(async move {
                let mut out = greeting();
                out.extend(ready("ROUTER"));
                out.extend(huge_frame(1 << 62));
                let _ = s.write_all(&out).await;
                let mut buf = [0u8; 4096];
                while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    let bootstrap = BootstrapServer::start("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    BootstrapClient::new(Duration::from_secs(5), RetryPolicy::default())
        .register(
            &bootstrap.url(),
            &RegisterRequest {
                engine_id: "evil".into(),
                dp_rank: 0,
                tp_rank: 0,
                pp_rank: 0,
                addr: format!("tcp://{fake_addr}"),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let d = Decode::start(1, spec(), env(30));
    let t0 = Instant::now();
    let out = d
        .pull(&bootstrap.url(), "evil", vec![req("d-1", "xfer-1", &[1])])
        .await;
    assert!(out[0].ok.is_empty());
    assert!(out[0].failed[0].1.contains("limit"), "{out:?}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

/// A change to a valid pull message.
type Edit = Box<dyn Fn(&mut mooncake_connector::connector::protocol::XferMetadata)>;

/// One raw pull over a DEALER; the first reply, if any within `within`.
async fn raw_pull_once(
    addr: &str,
    payload: Vec<u8>,
    within: Duration,
) -> Option<mooncake_connector::connector::protocol::XferResponse> {
    use zeromq::{Socket, SocketRecv, SocketSend};
    let mut s = zeromq::DealerSocket::new();
    s.connect(addr).await.unwrap();
    s.send(zeromq::ZmqMessage::from(bytes::Bytes::from(payload)))
        .await
        .unwrap();
    let m = tokio::time::timeout(within, s.recv()).await.ok()?.ok()?;
    mooncake_connector::connector::protocol::decode("response", m.into_vec().last()?).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_field_values_get_an_error_reply_naming_the_field() {
    use mooncake_connector::connector::protocol::{encode, XferStatus};
    let p = Prefill::start(1, spec(), env(5)).await;
    let d = Decode::start(1, spec(), env(5));
    let addr = p.producer(0).side_channel_addr().to_string();
    let base = {
        let mut m = mooncake_connector::connector::protocol::XferMetadata {
            remote_hostname: "127.0.0.1".into(),
            remote_port: d.ranks[0].0.engine.rpc_port() as u64,
            remote_tp_size: 0,
            remote_tp_rank: 0,
            req_blocks: [("d-x".to_string(), ("xfer-x".to_string(), vec![vec![1u64]]))]
                .into_iter()
                .collect(),
            kv_caches_base_addr: vec![],
            block_lens: vec![],
            kv_block_lens: vec![],
            registered_layer_names: vec![],
            registered_layer_indices: vec![],
            registered_group_indices: vec![],
            remote_pp_size: 1,
        };
        d.ranks[0].0.layout.fill_metadata(&mut m);
        m
    };
    let num_blocks = p.ctx(0).spec.max_blocks();
    let cases: Vec<(&str, Edit)> = vec![
        ("remote_tp_size", Box::new(|m| m.remote_tp_size = 1 << 34)),
        ("remote_tp_size", Box::new(|m| m.remote_tp_size = 1 << 63)),
        ("remote_tp_rank", Box::new(|m| m.remote_tp_rank = 7)),
        ("remote_port", Box::new(|m| m.remote_port = 1 << 40)),
        ("block_lens", Box::new(|m| m.block_lens.truncate(1))),
        (
            "req_blocks",
            Box::new(|m| {
                m.req_blocks
                    .insert("d-y".into(), ("xfer-y".into(), vec![vec![u64::MAX / 2]]));
            }),
        ),
        (
            "req_blocks",
            Box::new(move |m| {
                m.req_blocks.insert(
                    "d-z".into(),
                    ("xfer-z".into(), vec![(0..num_blocks + 1).collect()]),
                );
            }),
        ),
    ];
    for (field, edit) in cases {
        let mut m = base.clone();
        edit(&mut m);
        let r = raw_pull_once(&addr, encode(&m), Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("no reply to a pull with a bad {field}"));
        assert_eq!(r.status, XferStatus::Error, "{field}: {r:?}");
        let msg = r.err_msg.unwrap_or_default();
        assert!(msg.contains(field), "{field}: {msg}");
    }
    // The worker still serves.
    let tokens = tokenize("after the bad pulls");
    p.prefill("xfer-ok", "p-ok", &tokens, &[1, 2]);
    let out = d
        .pull(
            &p.bootstrap_url(),
            &p.engine_id,
            vec![req("d-ok", "xfer-ok", &[4, 5])],
        )
        .await;
    all_ok(&out, &["d-ok"]);
}
