//! KV bytes per second from a prefill worker to a decode worker over the
//! connector (side channel + transfer engine, TCP on 127.0.0.1), for prompts
//! of 128 to 32k tokens, with the descriptor count per request. Each case is
//! the median of several runs. Decode blocks are either contiguous (one
//! descriptor per layer after coalescing) or scattered (every other block:
//! one descriptor per block and layer).
//!
//! ```text
//! cargo run --release --example kv_bench [-- --runs 5 --layers 8 --heads 8 --head-size 64]
//! ```
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_connector::connector::bootstrap::{
    BootstrapClient, BootstrapServer, RegisterRequest, RetryPolicy,
};
use mooncake_connector::connector::{
    ConnectorEnv, ConnectorStats, Consumer, KvTransferConfig, Producer, ProducerEvent, PullRequest,
    WorkerContext,
};
use mooncake_connector::sim::model::{fill_block, ModelSpec};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn config(role: &str) -> KvTransferConfig {
    KvTransferConfig::from_json(&format!(
        r#"{{"kv_connector":"MooncakeConnector","kv_role":"{role}","engine_id":"bench-{role}","kv_connector_extra_config":{{"mooncake_protocol":"tcp"}}}}"#
    ))
    .unwrap()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs = arg("--runs", 5).max(1);
    let max_tokens = 32 * 1024;
    let spec = ModelSpec {
        layers: arg("--layers", 8),
        heads: arg("--heads", 8),
        head_size: arg("--head-size", 64),
        block_size: 16,
        num_blocks: 2 * max_tokens / 16 + 4,
    };
    let env = ConnectorEnv {
        host_ip: "127.0.0.1".into(),
        ..ConnectorEnv::default()
    };
    let stats_p = Arc::new(ConnectorStats::default());
    let stats_d = Arc::new(ConnectorStats::default());
    let p_ctx = Arc::new(
        WorkerContext::new(
            config("kv_producer"),
            env.clone(),
            spec.cache_spec(1),
            1,
            0,
            0,
            stats_p.clone(),
        )
        .unwrap(),
    );
    let d_ctx = Arc::new(
        WorkerContext::new(
            config("kv_consumer"),
            env.clone(),
            spec.cache_spec(1),
            1,
            0,
            0,
            stats_d,
        )
        .unwrap(),
    );
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let producer = Producer::start(p_ctx.clone(), tx).await.unwrap();
    let bootstrap = BootstrapServer::start("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    BootstrapClient::new(Duration::from_secs(5), RetryPolicy::default())
        .register(
            &bootstrap.url(),
            &RegisterRequest {
                engine_id: "bench-kv_producer".into(),
                dp_rank: 0,
                tp_rank: 0,
                pp_rank: 0,
                addr: producer.side_channel_addr().into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let consumer = Consumer::new(d_ctx);
    // Fill the prefill cache once with a prompt of the longest length.
    let tokens: Vec<u32> = (0..max_tokens as u32).map(|i| i % 251).collect();
    let mut buf = vec![0u8; spec.kv_block_len(1)];
    for layer in 0..spec.layers {
        for b in 0..spec.blocks_for(max_tokens) {
            fill_block(&spec, 1, 0, layer, &tokens, b, &mut buf);
            p_ctx
                .kv
                .write_shared(p_ctx.block_offset(layer, b as u64), &buf)
                .unwrap();
        }
    }
    println!(
        "mooncake-rs connector KV transfer, prefill -> decode, TCP on 127.0.0.1, 1 request per pull, median of {runs} runs"
    );
    println!(
        "model: {} layers x {} KV heads x {} bytes/head, block {} tokens ({} KiB per block and layer)\n",
        spec.layers,
        spec.heads,
        spec.head_size,
        spec.block_size,
        spec.kv_block_len(1) / 1024
    );
    println!(
        "{:>7} {:>10} {:>12} {:>12} {:>10} {:>12}",
        "tokens", "layout", "KV bytes", "descriptors", "ms", "GB/s"
    );
    let mut seq = 0u64;
    for &n in &[128usize, 512, 2048, 8192, 32768] {
        let nb = spec.blocks_for(n) as u64;
        for scattered in [false, true] {
            let src: Vec<u64> = (0..nb).collect();
            let dst: Vec<u64> = if scattered {
                (0..nb).map(|b| 2 * b + 1).collect()
            } else {
                (0..nb).collect()
            };
            let mut times = Vec::new();
            let mut descs = 0;
            let mut bytes = 0;
            for _ in 0..runs {
                seq += 1;
                let tid = format!("xfer-{seq}");
                let before = stats_p.snapshot();
                producer.request_ready(&tid, &format!("p-{seq}"), vec![src.clone()]);
                let t0 = Instant::now();
                let out = consumer
                    .pull(
                        &bootstrap.url(),
                        "bench-kv_producer",
                        vec![PullRequest {
                            d_req_id: format!("d-{seq}"),
                            transfer_id: tid,
                            blocks: vec![dst.clone()],
                        }],
                    )
                    .await;
                times.push(t0.elapsed());
                assert!(out.failed.is_empty(), "{:?}", out.failed);
                let after = stats_p.snapshot();
                descs = after.descriptors_sent - before.descriptors_sent;
                bytes = after.bytes_sent - before.bytes_sent;
                assert!(matches!(
                    events.recv().await,
                    Some(ProducerEvent::FinishedSending { .. })
                ));
            }
            times.sort();
            let med = times[times.len() / 2];
            println!(
                "{n:>7} {:>10} {bytes:>12} {descs:>12} {:>10.2} {:>12.2}",
                if scattered { "scattered" } else { "contiguous" },
                med.as_secs_f64() * 1e3,
                bytes as f64 / med.as_secs_f64() / 1e9
            );
        }
    }
}
