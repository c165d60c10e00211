//! The plain entry point: what an inference engine calls to take part in
//! disaggregation as a producer (prefill), a consumer (decode) or both.
//!
//! [`Connector::start`] sets up one worker per TP rank (memory registered,
//! side channel listening for a producer), reaches the bootstrap server (the
//! embedded one unless `bootstrap_server_address` names another) and
//! registers every producer rank there. Dropping the [`Connector`] (or
//! [`Connector::shutdown`]) stops the side channels and the embedded server.
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::bootstrap::{
    BootstrapClient, BootstrapServer, ExpectedTopology, RegisterRequest, RetryPolicy,
};
use super::{
    ConnectorEnv, ConnectorError, ConnectorStats, Consumer, KvCacheSpec, KvTransferConfig,
    Producer, ProducerEvent, PullOutcome, PullRequest, WorkerContext,
};

/// What [`Connector::start`] needs: the engine's settings and its KV cache.
#[derive(Debug, Clone)]
pub struct ConnectorOptions {
    /// The `--kv-transfer-config` (role, engine id, extra config).
    pub kv: KvTransferConfig,
    /// `VLLM_MOONCAKE_*` / `VLLM_HOST_IP` settings.
    pub env: ConnectorEnv,
    /// One TP rank's KV cache geometry, every layer of the model (each PP
    /// stage takes its share, see [`KvCacheSpec::stage`]).
    pub cache: KvCacheSpec,
    /// Tensor-parallel size.
    pub tp: usize,
    /// Pipeline-parallel size: `tp × pp` workers in all, in this process.
    pub pp: usize,
    /// Data-parallel rank of this engine.
    pub dp_rank: u32,
}

/// One worker (TP rank of a PP stage) of a running connector.
pub struct ConnectorRank {
    /// The rank's engine, registered KV cache and layout.
    pub ctx: Arc<WorkerContext>,
    /// Its side channel, when the role produces KV.
    pub producer: Option<Producer>,
    /// Its puller, when the role consumes KV.
    pub consumer: Option<Consumer>,
}

/// A running connector: every TP rank's worker, and the embedded bootstrap
/// server when this producer runs one.
///
/// ```no_run
/// # async fn demo(opts: mooncake_connector::connector::start::ConnectorOptions)
/// # -> Result<(), mooncake_connector::connector::ConnectorError> {
/// use mooncake_connector::connector::Connector;
///
/// let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
/// let connector = Connector::start(opts, events_tx).await?;
/// // Prefill side: announce, then hand over the blocks of a finished request.
/// connector.request_started("transfer-1");
/// connector.request_ready("transfer-1", "prefill-req-1", vec![vec![0, 1, 2]]);
/// // Each rank reports when decoders pulled it (or it expired).
/// while let Some(event) = events.recv().await {
///     tracing::info!("{event:?}");
/// }
/// connector.shutdown().await;
/// # Ok(()) }
/// ```
pub struct Connector {
    ranks: Vec<ConnectorRank>,
    bootstrap: Option<BootstrapServer>,
    bootstrap_url: Option<String>,
    stats: Arc<ConnectorStats>,
}

impl Connector {
    /// Starts one worker per TP rank for the configured role. A producer
    /// also starts its side channels, the embedded bootstrap server (unless
    /// `bootstrap_server_address` is set) and registers every rank; its
    /// ranks' [`ProducerEvent`]s go to `events` (one per rank and request).
    pub async fn start(
        opts: ConnectorOptions,
        events: mpsc::UnboundedSender<ProducerEvent>,
    ) -> Result<Self, ConnectorError> {
        let stats = Arc::new(ConnectorStats::default());
        let pp = opts.pp.max(1);
        let mut ranks = Vec::with_capacity(opts.tp * pp);
        for stage in 0..pp {
            for rank in 0..opts.tp {
                ranks.push(start_rank(&opts, (rank, stage), &stats, &events).await?);
            }
        }
        let mut connector = Self {
            ranks,
            bootstrap: None,
            bootstrap_url: None,
            stats,
        };
        if opts.kv.kv_role.is_producer() {
            connector.register_producers(&opts).await?;
        }
        Ok(connector)
    }

    /// Reaches (or starts) the bootstrap server and registers every rank's
    /// side channel there.
    async fn register_producers(&mut self, opts: &ConnectorOptions) -> Result<(), ConnectorError> {
        let url = match &opts.kv.bootstrap_server_address {
            Some(hp) => hp.url(),
            None => {
                let server = start_embedded_bootstrap(opts).await?;
                let url = server.url();
                self.bootstrap = Some(server);
                url
            }
        };
        let client = BootstrapClient::new(opts.env.connector_timeout, RetryPolicy::default())
            .with_token(opts.env.bootstrap_token.clone());
        for r in &self.ranks {
            let Some(p) = &r.producer else { continue };
            let req = RegisterRequest {
                engine_id: opts.kv.engine_id.clone(),
                dp_rank: opts.dp_rank,
                tp_rank: r.ctx.layout.tp_rank as u32,
                pp_rank: r.ctx.layout.pp_rank as u32,
                addr: p.side_channel_addr().to_string(),
                // vLLM's newer server needs tp_size for TP > 1.
                tp_size: Some(opts.tp as u32),
                pp_size: Some(opts.pp.max(1) as u32),
                dp_size: None,
            };
            client.register(&url, &req).await?;
        }
        tracing::info!(target: "mooncake_connector::start", engine_id = %opts.kv.engine_id,
            bootstrap = %url, tp = opts.tp, pp = opts.pp, "prefill workers registered");
        self.bootstrap_url = Some(url);
        Ok(())
    }

    /// Every worker: stage 0's TP ranks in rank order, then stage 1's, and
    /// so on.
    pub fn ranks(&self) -> &[ConnectorRank] {
        &self.ranks
    }

    /// The counters shared by every rank.
    pub fn stats(&self) -> &Arc<ConnectorStats> {
        &self.stats
    }

    /// The embedded bootstrap server's URL, if this connector runs one.
    pub fn embedded_bootstrap_url(&self) -> Option<String> {
        self.bootstrap.as_ref().map(|b| b.url())
    }

    /// The bootstrap server this producer registered with.
    pub fn bootstrap_url(&self) -> Option<&str> {
        self.bootstrap_url.as_deref()
    }

    fn producers(&self) -> impl Iterator<Item = &Producer> {
        self.ranks.iter().filter_map(|r| r.producer.as_ref())
    }

    /// A prefill request for `transfer_id` was admitted (on every rank).
    pub fn request_started(&self, transfer_id: &str) {
        self.producers()
            .for_each(|p| p.request_started(transfer_id));
    }

    /// A prefill request finished: its KV is in `blocks` on every rank.
    pub fn request_ready(&self, transfer_id: &str, p_req_id: &str, blocks: Vec<Vec<u64>>) {
        self.producers()
            .for_each(|p| p.request_ready(transfer_id, p_req_id, blocks.clone()));
    }

    /// A prefill request was aborted: nothing will be sent for it.
    pub fn request_aborted(&self, transfer_id: &str) {
        self.producers()
            .for_each(|p| p.request_aborted(transfer_id));
    }

    /// Looks up the prefill engine `engine_id` at `bootstrap` (rank 0's
    /// consumer; every rank shares the answer's shape). Ok when this
    /// connector does not consume.
    pub async fn lookup(&self, bootstrap: &str, engine_id: &str) -> Result<(), ConnectorError> {
        match self.ranks.first().and_then(|r| r.consumer.as_ref()) {
            Some(c) => c.lookup(bootstrap, engine_id).await.map(|_| ()),
            None => Ok(()),
        }
    }

    /// Pulls `reqs` on every consumer rank at once; one outcome per rank.
    pub async fn pull(
        &self,
        bootstrap: &str,
        engine_id: &str,
        reqs: Vec<PullRequest>,
    ) -> Vec<PullOutcome> {
        let pulls = self
            .ranks
            .iter()
            .filter_map(|r| r.consumer.as_ref())
            .map(|c| c.pull(bootstrap, engine_id, reqs.clone()));
        futures::future::join_all(pulls).await
    }

    /// Stops every side channel and the embedded bootstrap server, waiting
    /// for the server to close.
    pub async fn shutdown(mut self) {
        self.ranks.clear();
        if let Some(server) = self.bootstrap.take() {
            server.stop().await;
        }
    }
}

/// One rank's worker: memory registered off the async runtime, then its
/// side channel (producer) and puller (consumer).
async fn start_rank(
    opts: &ConnectorOptions,
    (rank, stage): (usize, usize),
    stats: &Arc<ConnectorStats>,
    events: &mpsc::UnboundedSender<ProducerEvent>,
) -> Result<ConnectorRank, ConnectorError> {
    let pp = opts.pp.max(1);
    let (kv, env, cache, stats) = (
        opts.kv.clone(),
        opts.env.clone(),
        opts.cache
            .stage(pp, stage, opts.env.pp_layer_partition.as_deref())?,
        stats.clone(),
    );
    let (tp, dp) = (opts.tp, opts.dp_rank);
    let ctx = tokio::task::spawn_blocking(move || {
        WorkerContext::new(kv, env, cache, (tp, rank), (pp, stage), dp, stats)
    })
    .await
    .map_err(|e| ConnectorError::config("worker setup", e))??;
    let ctx = Arc::new(ctx);
    let role = opts.kv.kv_role;
    let producer = if role.is_producer() {
        Some(Producer::start(ctx.clone(), events.clone()).await?)
    } else {
        None
    };
    let consumer = role.is_consumer().then(|| Consumer::new(ctx.clone()));
    Ok(ConnectorRank {
        ctx,
        producer,
        consumer,
    })
}

/// The bootstrap server a producer's rank 0 embeds, on
/// `VLLM_HOST_IP:VLLM_MOONCAKE_BOOTSTRAP_PORT`.
async fn start_embedded_bootstrap(
    opts: &ConnectorOptions,
) -> Result<BootstrapServer, ConnectorError> {
    let bind: SocketAddr = format!("{}:{}", opts.env.host_ip, opts.env.bootstrap_port)
        .parse()
        .map_err(|e| ConnectorError::config("VLLM_HOST_IP", e))?;
    let expected = ExpectedTopology {
        dp_size: 1,
        tp_size: opts.tp as u32,
        pp_size: opts.pp.max(1) as u32,
    };
    BootstrapServer::start_with_token(bind, Some(expected), opts.env.bootstrap_token.clone()).await
}
