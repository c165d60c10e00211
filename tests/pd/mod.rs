//! In-process prefill and decode workers (real engines on 127.0.0.1, real
//! bootstrap server, real ZMQ side channel) for connector tests.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use mooncake_connector::connector::{
    Connector, ConnectorEnv, ConnectorOptions, ConnectorStats, Consumer, KvTransferConfig,
    Producer, ProducerEvent, PullOutcome, PullRequest, WorkerContext,
};
use mooncake_connector::sim::engine::{SimEngine, SimEngineConfig};
use mooncake_connector::sim::kv_check::{fill_kv, verify_kv};
use mooncake_connector::sim::model::ModelSpec;
use mooncake_connector::sim::server::router;
use tokio::sync::mpsc;

pub fn env(abort_secs: u64) -> ConnectorEnv {
    ConnectorEnv {
        bootstrap_port: 0,
        connector_timeout: Duration::from_secs(5),
        abort_request_timeout: Duration::from_secs(abort_secs),
        host_ip: "127.0.0.1".into(),
        ..ConnectorEnv::default()
    }
}

pub fn spec() -> ModelSpec {
    ModelSpec {
        layers: 3,
        heads: 4,
        head_size: 8,
        block_size: 4,
        num_blocks: 64,
        ..ModelSpec::default()
    }
}

/// Serves `app` on a free port of 127.0.0.1; its URL.
pub async fn serve_app(app: axum::Router) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    url
}

/// A simulated engine and the URL of its HTTP API.
pub struct Served {
    pub engine: Arc<SimEngine>,
    pub url: String,
}

/// Starts a simulated engine with `cfg` and serves its HTTP API on a free
/// port of 127.0.0.1.
pub async fn serve_engine(cfg: SimEngineConfig) -> Served {
    let engine = SimEngine::start(cfg).await.unwrap();
    let url = serve_app(router(engine.clone())).await;
    Served { engine, url }
}

/// The `kv_connector_extra_config` the helpers use unless told otherwise.
pub const TCP_EXTRA: &str = r#"{"mooncake_protocol":"tcp","num_workers":2}"#;

fn config(role: &str, engine_id: &str, extra: &str) -> KvTransferConfig {
    KvTransferConfig::from_json(&format!(
        r#"{{"kv_connector":"MooncakeConnector","kv_role":"{role}","engine_id":"{engine_id}",
            "kv_connector_extra_config":{extra}}}"#
    ))
    .unwrap()
}

/// A prefill engine as an inference engine runs one: [`Connector::start`]
/// with the producer role (a worker and side channel per TP rank, the
/// embedded bootstrap server on 127.0.0.1, every rank registered there).
pub struct Prefill {
    pub connector: Connector,
    pub engine_id: String,
    pub spec: ModelSpec,
    pub tp: usize,
    pub events: mpsc::UnboundedReceiver<ProducerEvent>,
    pub stats: Arc<ConnectorStats>,
}

impl Prefill {
    pub async fn start(tp: usize, spec: ModelSpec, env: ConnectorEnv) -> Self {
        Self::start_with(tp, spec, env, TCP_EXTRA).await
    }

    /// As [`start`](Self::start), with `extra` as `kv_connector_extra_config`.
    pub async fn start_with(tp: usize, spec: ModelSpec, env: ConnectorEnv, extra: &str) -> Self {
        let engine_id = format!("prefill-{}", uuid::Uuid::new_v4());
        let (tx, events) = mpsc::unbounded_channel();
        let opts = ConnectorOptions {
            kv: config("kv_producer", &engine_id, extra),
            env,
            cache: spec.cache_spec(tp),
            tp,
            pp: 1,
            dp_rank: 0,
        };
        let connector = Connector::start(opts, tx).await.unwrap();
        let stats = connector.stats().clone();
        Self {
            connector,
            engine_id,
            spec,
            tp,
            events,
            stats,
        }
    }

    /// The bootstrap server every rank registered with.
    pub fn bootstrap_url(&self) -> String {
        self.connector
            .bootstrap_url()
            .expect("a producer registers")
            .to_string()
    }

    /// Rank `rank`'s worker (engine, registered KV cache, layout).
    pub fn ctx(&self, rank: usize) -> &Arc<WorkerContext> {
        &self.connector.ranks()[rank].ctx
    }

    /// Rank `rank`'s side channel.
    pub fn producer(&self, rank: usize) -> &Producer {
        self.connector.ranks()[rank]
            .producer
            .as_ref()
            .expect("the producer role")
    }

    /// Runs the "prefill" of `tokens` into `blocks` on every rank and marks
    /// the transfer ready.
    pub fn prefill(&self, transfer_id: &str, p_req_id: &str, tokens: &[u32], blocks: &[u64]) {
        self.fill(tokens, blocks);
        self.connector
            .request_ready(transfer_id, p_req_id, vec![blocks.to_vec()]);
    }

    pub fn fill(&self, tokens: &[u32], blocks: &[u64]) {
        let ranks = self.connector.ranks().iter().map(|r| &*r.ctx);
        fill_kv(&self.spec, ranks, tokens, &[blocks.to_vec()]).unwrap();
    }

    pub fn abort(&self, transfer_id: &str) {
        self.connector.request_aborted(transfer_id);
    }

    /// The next event within `within`, if any.
    pub async fn next_event(&mut self, within: Duration) -> Option<ProducerEvent> {
        tokio::time::timeout(within, self.events.recv())
            .await
            .ok()
            .flatten()
    }
}

pub struct Decode {
    pub spec: ModelSpec,
    pub tp: usize,
    pub ranks: Vec<(Arc<WorkerContext>, Consumer)>,
    pub stats: Arc<ConnectorStats>,
}

impl Decode {
    pub fn start(tp: usize, spec: ModelSpec, env: ConnectorEnv) -> Self {
        Self::start_with(tp, spec, env, TCP_EXTRA)
    }

    /// As [`start`](Self::start), with `extra` as `kv_connector_extra_config`.
    pub fn start_with(tp: usize, spec: ModelSpec, env: ConnectorEnv, extra: &str) -> Self {
        let stats = Arc::new(ConnectorStats::default());
        let ranks = (0..tp)
            .map(|rank| {
                let ctx = Arc::new(
                    WorkerContext::new(
                        config("kv_consumer", "decode", extra),
                        env.clone(),
                        spec.cache_spec(tp),
                        (tp, rank),
                        (1, 0),
                        0,
                        stats.clone(),
                    )
                    .unwrap(),
                );
                let c = Consumer::new(ctx.clone());
                (ctx, c)
            })
            .collect();
        Self {
            spec,
            tp,
            ranks,
            stats,
        }
    }

    /// Every rank pulls `reqs` (its own blocks are the same ids on every
    /// rank); returns one outcome per rank.
    pub async fn pull(
        &self,
        bootstrap: &str,
        engine_id: &str,
        reqs: Vec<PullRequest>,
    ) -> Vec<PullOutcome> {
        futures::future::join_all(
            self.ranks
                .iter()
                .map(|(_, c)| c.pull(bootstrap, engine_id, reqs.clone())),
        )
        .await
    }

    /// Checks the KV of `tokens` in `blocks` (every position but the last)
    /// on every rank; Err names the first wrong position.
    pub fn verify(&self, tokens: &[u32], blocks: &[u64]) -> Result<u64, String> {
        let ranks = self.ranks.iter().map(|(ctx, _)| &**ctx);
        verify_kv(&self.spec, ranks, tokens, &[blocks.to_vec()])
    }
}

pub fn req(d: &str, t: &str, blocks: &[u64]) -> PullRequest {
    PullRequest {
        d_req_id: d.into(),
        transfer_id: t.into(),
        blocks: vec![blocks.to_vec()],
    }
}

pub fn all_ok(outcomes: &[PullOutcome], ids: &[&str]) {
    for (rank, o) in outcomes.iter().enumerate() {
        assert!(o.failed.is_empty(), "rank {rank}: {:?}", o.failed);
        for id in ids {
            assert!(
                o.ok.iter().any(|x| x == id),
                "rank {rank}: {id} not ok ({o:?})"
            );
        }
    }
}
