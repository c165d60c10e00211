//! A simulated serving engine built on the connector: it prefills prompts
//! into a KV cache in registered memory (one worker per TP rank), sends that
//! KV to decoders, or pulls it and decodes from it, following vLLM's
//! request lifecycle: prefill requests that finish length-capped keep their
//! blocks until every decoder pulled them (or the abort timeout passes); an
//! aborted prefill releases them at once; a decode request aborted before it
//! was scheduled sends an empty pull so the prefiller can free its blocks.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};

use super::blocks::{self, GroupPools};
use super::compute_pool::ComputePool;
use super::kv_check;
use super::model::{self, ModelSpec};
pub use super::request::{
    GenerateError, GenerateOutput, GenerateRequest, KvSource, KvTransferParams,
};
use crate::connector::start::{Connector, ConnectorOptions};
use crate::connector::{
    ConnectorEnv, ConnectorError, ConnectorStats, KvRole, KvTransferConfig, LoadFailurePolicy,
    ProducerEvent, PullRequest,
};

/// How a simulated engine is set up.
#[derive(Debug, Clone)]
pub struct SimEngineConfig {
    /// The `--kv-transfer-config`.
    pub kv: KvTransferConfig,
    /// `VLLM_MOONCAKE_*` settings.
    pub env: ConnectorEnv,
    /// Model and cache geometry.
    pub spec: ModelSpec,
    /// Tensor-parallel workers (per stage).
    pub tp: usize,
    /// Pipeline-parallel stages (`tp × pp` workers in all).
    pub pp: usize,
    /// Data-parallel rank of this engine.
    pub dp_rank: u32,
    /// Model name reported in responses.
    pub model_name: String,
    /// Requests decoded at once; the rest wait unscheduled.
    pub max_num_seqs: usize,
    /// Simulated prefill compute time per prompt token.
    pub prefill_time_per_token: Duration,
    /// Most KV blocks prefill requests may hold for remote decoders at once
    /// (`--remote-decode-block-budget`); a prefill leg beyond it is answered
    /// 503 instead of starving the scheduler.
    pub remote_decode_block_budget: usize,
}

struct Held {
    ranks_left: usize,
    blocks: Vec<Vec<u64>>,
    since: Instant,
}

/// A running simulated engine.
pub struct SimEngine {
    cfg: SimEngineConfig,
    connector: Connector,
    pool: GroupPools,
    compute: ComputePool,
    sched: Semaphore,
    stats: Arc<ConnectorStats>,
    held: Mutex<HashMap<String, Held>>,
    // Blocks reserved against the remote-decode budget (held, or being
    // prefilled for a decoder).
    remote_reserved: Mutex<usize>,
    budget_refusals: std::sync::atomic::AtomicU64,
    started: Instant,
    aborted_prefills: std::sync::atomic::AtomicU64,
    released_decodes: std::sync::atomic::AtomicU64,
}

impl SimEngine {
    /// Starts the workers; a producer also starts its side channels, the
    /// embedded bootstrap server (unless `bootstrap_server_address` is set)
    /// and registers every rank once its memory is registered.
    pub async fn start(cfg: SimEngineConfig) -> Result<Arc<Self>, ConnectorError> {
        cfg.spec
            .validate(cfg.tp)
            .map_err(|e| ConnectorError::config("model geometry", e))?;
        let (tx, mut rx) = mpsc::unbounded_channel::<ProducerEvent>();
        let options = ConnectorOptions {
            kv: cfg.kv.clone(),
            env: cfg.env.clone(),
            cache: cfg.spec.cache_spec(cfg.tp),
            tp: cfg.tp,
            pp: cfg.pp,
            dp_rank: cfg.dp_rank,
        };
        let connector = Connector::start(options, tx).await?;
        let stats = connector.stats().clone();
        let engine = Arc::new(Self {
            pool: GroupPools::new(cfg.spec.groups(), cfg.spec.num_blocks),
            compute: ComputePool::new(ComputePool::default_size())
                .map_err(|e| ConnectorError::config("compute threads", e.to_string()))?,
            sched: Semaphore::new(cfg.max_num_seqs.max(1)),
            cfg,
            connector,
            stats,
            held: Mutex::new(HashMap::new()),
            remote_reserved: Mutex::new(0),
            budget_refusals: Default::default(),
            started: Instant::now(),
            aborted_prefills: Default::default(),
            released_decodes: Default::default(),
        });
        let weak = Arc::downgrade(&engine);
        tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                let Some(engine) = weak.upgrade() else { break };
                let p_req_id = match ev {
                    ProducerEvent::FinishedSending { p_req_id, .. }
                    | ProducerEvent::Expired { p_req_id, .. } => p_req_id,
                };
                engine.rank_done(&p_req_id);
            }
        });
        Ok(engine)
    }

    /// The engine's configuration.
    pub fn config(&self) -> &SimEngineConfig {
        &self.cfg
    }

    /// The embedded bootstrap server's URL, if this engine runs one.
    pub fn bootstrap_url(&self) -> Option<String> {
        self.connector.embedded_bootstrap_url()
    }

    /// Counters and block usage as JSON (`GET /metrics`).
    pub fn metrics(&self) -> Value {
        let s = self.stats.snapshot();
        json!({
            "role": self.cfg.kv.kv_role.as_str(),
            "engine_id": self.cfg.kv.engine_id,
            "tp": self.cfg.tp,
            "pp": self.cfg.pp,
            "connector": s,
            "blocks_total": self.pool.total(),
            "blocks_free": self.pool.available(),
            "requests_holding_kv": self.held.lock().unwrap().len(),
            "remote_decode_blocks_held": *self.remote_reserved.lock().unwrap(),
            "remote_decode_block_budget": self.cfg.remote_decode_block_budget,
            "remote_decode_budget_refusals": self.budget_refusals.load(Ordering::Relaxed),
            "held_kv": self.held_kv(),
            "aborted_prefills": self.aborted_prefills.load(Ordering::Relaxed),
            "released_decodes": self.released_decodes.load(Ordering::Relaxed),
            "uptime_s": self.started.elapsed().as_secs_f64(),
        })
    }

    /// The requests holding KV for decoders: blocks and age, oldest first
    /// (at most 32 listed).
    fn held_kv(&self) -> Value {
        let held = self.held.lock().unwrap();
        let mut v: Vec<(&String, &Held)> = held.iter().collect();
        v.sort_by_key(|(_, h)| h.since);
        let oldest = v
            .first()
            .map_or(0.0, |(_, h)| h.since.elapsed().as_secs_f64());
        let list: Vec<Value> = v
            .iter()
            .take(32)
            .map(|(id, h)| json!({"request": id, "blocks": blocks::count(&h.blocks), "age_s": h.since.elapsed().as_secs_f64()}))
            .collect();
        json!({"oldest_age_s": oldest, "requests": list})
    }

    /// Reserves `n` blocks of the remote-decode budget, or says why not.
    fn reserve_remote(&self, n: usize) -> Result<(), GenerateError> {
        let mut r = self.remote_reserved.lock().unwrap();
        let budget = self.cfg.remote_decode_block_budget;
        if *r + n > budget {
            self.budget_refusals.fetch_add(1, Ordering::Relaxed);
            return Err(GenerateError {
                status: 503,
                kind: "kv_budget_exhausted",
                message: format!(
                    "{} of {budget} KV blocks are held for remote decoders; this request needs {n} more \
                     (--remote-decode-block-budget); retry later",
                    *r
                ),
            });
        }
        *r += n;
        Ok(())
    }

    fn release_remote(&self, n: usize) {
        let mut r = self.remote_reserved.lock().unwrap();
        *r = r.saturating_sub(n);
    }

    fn rank_done(&self, p_req_id: &str) {
        let mut held = self.held.lock().unwrap();
        let Some(h) = held.get_mut(p_req_id) else {
            return;
        };
        h.ranks_left -= 1;
        if h.ranks_left == 0 {
            let h = held.remove(p_req_id).expect("present");
            self.pool.free(&h.blocks);
            self.release_remote(blocks::count(&h.blocks));
        }
    }

    /// Runs one request to completion. `cancelled` is set when the client
    /// went away; the request then aborts at the next safe point, never
    /// while a transfer may still touch its blocks.
    pub async fn generate(
        self: &Arc<Self>,
        req: GenerateRequest,
        cancelled: Arc<AtomicBool>,
    ) -> Result<GenerateOutput, GenerateError> {
        if req.prompt.is_empty() {
            return Err(GenerateError::bad_request("the prompt is empty"));
        }
        let tokens = model::tokenize(&req.prompt);
        let needed = self.cfg.spec.blocks_per_group(tokens.len());
        if !self.pool.fits(&needed) {
            return Err(GenerateError::bad_request(format!(
                "the prompt needs {needed:?} KV blocks (per group); the cache has {} per group",
                self.cfg.spec.num_blocks
            )));
        }
        let kv = req.kv.clone().unwrap_or_default();
        let role = self.cfg.kv.kv_role;
        if kv.do_remote_decode && role.is_producer() {
            return self
                .prefill_for_decoder(req, tokens, kv.transfer_id, cancelled)
                .await;
        }
        if kv.do_remote_prefill && role.is_consumer() {
            match (
                &kv.remote_engine_id,
                &kv.remote_bootstrap_addr,
                &kv.transfer_id,
            ) {
                (Some(e), Some(b), Some(t)) => {
                    return self
                        .decode_remote(req, tokens, e.clone(), b.clone(), t.clone(), cancelled)
                        .await;
                }
                _ => tracing::warn!(target: "mooncake_connector::sim", request = %req.request_id,
                    "invalid KVTransferParams {kv:?}: need remote_engine_id, remote_bootstrap_addr and transfer_id; running without transfer"),
            }
        }
        self.local(req, tokens).await
    }

    fn reply(
        &self,
        req: &GenerateRequest,
        tokens: &[u32],
        digest: u64,
        source: KvSource,
    ) -> GenerateOutput {
        let text = model::generate(digest, *tokens.last().expect("non-empty"), req.max_tokens);
        GenerateOutput {
            completion_tokens: req.max_tokens,
            prompt_tokens: tokens.len(),
            text,
            finish_reason: "length",
            kv_source: source,
        }
    }

    async fn compute(self: &Arc<Self>, tokens: Arc<Vec<u32>>, blocks: Arc<Vec<Vec<u64>>>) {
        let delay = self.cfg.prefill_time_per_token * tokens.len() as u32;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let engine = self.clone();
        self.compute
            .run(move || engine.fill_kv(&tokens, &blocks))
            .await
            .expect("prefill compute task");
    }

    fn fill_kv(&self, tokens: &[u32], blocks: &[Vec<u64>]) {
        let ranks = self.connector.ranks().iter().map(|r| &*r.ctx);
        kv_check::fill_kv(&self.cfg.spec, ranks, tokens, blocks).expect("block inside the cache");
    }

    /// Checks the KV in `blocks` on every rank; Ok(digest) or the first
    /// wrong (rank, layer, position, head).
    fn verify_kv(&self, tokens: &[u32], blocks: &[Vec<u64>]) -> Result<u64, String> {
        let ranks = self.connector.ranks().iter().map(|r| &*r.ctx);
        kv_check::verify_kv(&self.cfg.spec, ranks, tokens, blocks)
    }

    async fn local(
        self: &Arc<Self>,
        req: GenerateRequest,
        tokens: Vec<u32>,
    ) -> Result<GenerateOutput, GenerateError> {
        let _permit = self.sched.acquire().await.expect("semaphore open");
        let blocks = self
            .pool
            .allocate(&self.cfg.spec.blocks_per_group(tokens.len()))
            .await
            .expect("fits, checked");
        let (tokens, blocks) = (Arc::new(tokens), Arc::new(blocks));
        self.compute(tokens.clone(), blocks.clone()).await;
        let digest = self.verify_kv(&tokens, &blocks);
        self.pool.free(&blocks);
        let digest = digest.map_err(GenerateError::kv)?;
        Ok(self.reply(&req, &tokens, digest, KvSource::Local))
    }

    async fn prefill_for_decoder(
        self: &Arc<Self>,
        req: GenerateRequest,
        tokens: Vec<u32>,
        transfer_id: Option<String>,
        cancelled: Arc<AtomicBool>,
    ) -> Result<GenerateOutput, GenerateError> {
        let needed = self.cfg.spec.blocks_per_group(tokens.len());
        if transfer_id.is_some() {
            self.reserve_remote(needed.iter().sum())?;
        }
        if let Some(tid) = &transfer_id {
            self.connector.request_started(tid);
        }
        let blocks = self.pool.allocate(&needed).await.expect("fits, checked");
        let (tokens, blocks) = (Arc::new(tokens), Arc::new(blocks));
        self.compute(tokens.clone(), blocks.clone()).await;
        let digest = model::expected_digest(&self.cfg.spec, &tokens);
        let out = self.reply(&req, &tokens, digest, KvSource::Local);
        let Some(tid) = transfer_id else {
            tracing::warn!(target: "mooncake_connector::sim", request = %req.request_id,
                "Missing transfer_id in kv_transfer_params from router!");
            self.pool.free(&blocks);
            return Ok(out);
        };
        if cancelled.load(Ordering::SeqCst) {
            // Finished for another reason than the length cap: nothing will
            // be sent; free the blocks now.
            tracing::info!(target: "mooncake_connector::sim", request = %req.request_id, transfer = %tid,
                "prefill aborted; releasing its KV blocks");
            self.connector.request_aborted(&tid);
            self.pool.free(&blocks);
            self.release_remote(blocks::count(&blocks));
            self.aborted_prefills.fetch_add(1, Ordering::Relaxed);
            return Err(client_gone());
        }
        let p_req_id = format!("{}-{:08x}", req.request_id, rand_u32());
        self.held.lock().unwrap().insert(
            p_req_id.clone(),
            Held {
                ranks_left: self.connector.ranks().len(),
                blocks: blocks.to_vec(),
                since: Instant::now(),
            },
        );
        self.connector
            .request_ready(&tid, &p_req_id, blocks.to_vec());
        Ok(out)
    }

    async fn decode_remote(
        self: &Arc<Self>,
        req: GenerateRequest,
        tokens: Vec<u32>,
        engine_id: String,
        bootstrap: String,
        transfer_id: String,
        cancelled: Arc<AtomicBool>,
    ) -> Result<GenerateOutput, GenerateError> {
        // Find the prefill engine first (bounded): an unreachable or silent
        // bootstrap server is a 503 naming it, not a KV failure.
        // With the recompute policy the request goes on and recomputes.
        let mut lookup_failure = None;
        if let Err(e) = self.connector.lookup(&bootstrap, &engine_id).await {
            if self.cfg.kv.kv_load_failure_policy == LoadFailurePolicy::Fail {
                return Err(GenerateError {
                    status: 503,
                    kind: "bootstrap_unavailable",
                    message: e.detail,
                });
            }
            lookup_failure = Some(e.detail);
        }
        let remote = RemoteKv {
            bootstrap: &bootstrap,
            engine_id: &engine_id,
            transfer_id: &transfer_id,
            d_req_id: format!("{}-{:08x}", req.request_id, rand_u32()),
            groups: self.cfg.spec.groups(),
        };
        let (_permit, blocks) = self
            .schedule_decode(&req, tokens.len(), &remote, &cancelled)
            .await?;
        let failure = match lookup_failure {
            Some(why) => Some(why),
            None => self.pull_kv(&req, &remote, &blocks, &cancelled).await?,
        };
        let out = self
            .finish_decode(&req, tokens, &blocks, &transfer_id, failure)
            .await;
        self.pool.free(&blocks);
        out
    }

    /// Scheduling: a sequence slot and blocks. A request whose client leaves
    /// before that tells the prefiller to release its blocks.
    async fn schedule_decode(
        &self,
        req: &GenerateRequest,
        num_tokens: usize,
        remote: &RemoteKv<'_>,
        cancelled: &AtomicBool,
    ) -> Result<(tokio::sync::SemaphorePermit<'_>, Vec<Vec<u64>>), GenerateError> {
        let scheduled = async {
            let permit = self.sched.acquire().await.expect("semaphore open");
            let blocks = self
                .pool
                .allocate(&self.cfg.spec.blocks_per_group(num_tokens))
                .await
                .expect("fits, checked");
            (permit, blocks)
        };
        tokio::select! {
            s = scheduled => Ok(s),
            () = wait_cancelled(cancelled) => {
                tracing::info!(target: "mooncake_connector::sim", request = %req.request_id, transfer = %remote.transfer_id,
                    "aborted before scheduling; releasing the prefiller's blocks");
                self.released_decodes.fetch_add(1, Ordering::Relaxed);
                self.pull_all(remote.bootstrap, remote.engine_id, remote.release()).await;
                Err(client_gone())
            }
        }
    }

    /// Pulls the KV into `blocks`: None when it arrived, else why not. A
    /// client that leaves mid-pull ends the request (and frees `blocks`).
    async fn pull_kv(
        &self,
        req: &GenerateRequest,
        remote: &RemoteKv<'_>,
        blocks: &[Vec<u64>],
        cancelled: &AtomicBool,
    ) -> Result<Option<String>, GenerateError> {
        let pull = PullRequest {
            d_req_id: remote.d_req_id.clone(),
            transfer_id: remote.transfer_id.to_string(),
            blocks: blocks.to_vec(),
        };
        // A client that leaves mid-pull: release the prefiller's blocks at
        // once (an empty pull, vLLM's own release). Our prefiller then ends
        // the waiting pull without writing; the blocks here are freed only
        // once that pull has ended, so nothing can write into them
        // afterwards (with a vLLM prefiller that is when it writes or times
        // out).
        let pulling = self.pull_all(remote.bootstrap, remote.engine_id, pull);
        tokio::pin!(pulling);
        tokio::select! {
            f = &mut pulling => Ok(f),
            () = wait_cancelled(cancelled) => {
                tracing::info!(target: "mooncake_connector::sim", request = %req.request_id, transfer = %remote.transfer_id,
                    "client left during the KV pull; releasing the prefiller's blocks");
                self.released_decodes.fetch_add(1, Ordering::Relaxed);
                let _ = tokio::join!(
                    self.pull_all(remote.bootstrap, remote.engine_id, remote.release()),
                    &mut pulling
                );
                self.pool.free(blocks);
                Err(client_gone())
            }
        }
    }

    /// The reply once the pull is over: from the received KV when it
    /// arrived and checks out, else per the KV load failure policy.
    async fn finish_decode(
        self: &Arc<Self>,
        req: &GenerateRequest,
        tokens: Vec<u32>,
        blocks: &[Vec<u64>],
        transfer_id: &str,
        failure: Option<String>,
    ) -> Result<GenerateOutput, GenerateError> {
        let result = match failure {
            None => self
                .verify_kv(&tokens, blocks)
                .map_err(|m| format!("received KV is wrong: {m}")),
            Some(why) => Err(why),
        };
        match result {
            Ok(digest) => Ok(self.reply(req, &tokens, digest, KvSource::Remote)),
            Err(why) => match self.cfg.kv.kv_load_failure_policy {
                LoadFailurePolicy::Fail => {
                    tracing::warn!(target: "mooncake_connector::sim", request = %req.request_id, "KV load failed: {why}");
                    Err(GenerateError::kv(format!(
                        "KV transfer for {transfer_id} failed: {why}"
                    )))
                }
                LoadFailurePolicy::Recompute => {
                    tracing::warn!(target: "mooncake_connector::sim", request = %req.request_id,
                        "KV load failed ({why}); recomputing the prompt locally");
                    let (t, b) = (Arc::new(tokens), Arc::new(blocks.to_vec()));
                    self.compute(t.clone(), b.clone()).await;
                    self.verify_kv(&t, &b)
                        .map(|d| self.reply(req, &t, d, KvSource::Recomputed))
                        .map_err(GenerateError::kv)
                }
            },
        }
    }

    /// Pulls on every rank; None when all succeeded, else the first reason.
    async fn pull_all(
        &self,
        bootstrap: &str,
        engine_id: &str,
        pull: PullRequest,
    ) -> Option<String> {
        let reqs = vec![pull];
        let outcomes = self
            .connector
            .pull(bootstrap, engine_id, reqs.clone())
            .await;
        // What vLLM's workers hand the scheduler: block ids, or the request
        // id for a hybrid model.
        let failures: Vec<_> = outcomes
            .iter()
            .flat_map(|o| o.load_failures(&reqs))
            .collect();
        if !failures.is_empty() {
            tracing::warn!(target: "mooncake_connector::sim", engine = engine_id,
                "KV load failures for the scheduler: {failures:?}");
        }
        outcomes
            .into_iter()
            .find_map(|o| o.failed.into_iter().next().map(|(_, why)| why))
    }
}

fn rand_u32() -> u32 {
    uuid::Uuid::new_v4().as_u128() as u32
}

/// Builds an engine config from the example binaries' common flags.
pub fn role_default_config(role: KvRole) -> String {
    format!(
        r#"{{"kv_connector":"MooncakeConnector","kv_role":"{}"}}"#,
        role.as_str()
    )
}

/// The error for a request whose client left.
fn client_gone() -> GenerateError {
    GenerateError {
        status: 499,
        kind: "aborted",
        message: "client disconnected".into(),
    }
}

/// Returns once `cancelled` is set (polled every 20 ms).
async fn wait_cancelled(cancelled: &AtomicBool) {
    while !cancelled.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Where a decode pulls its KV from, and under which ids.
struct RemoteKv<'a> {
    bootstrap: &'a str,
    engine_id: &'a str,
    transfer_id: &'a str,
    d_req_id: String,
    /// KV-cache groups (an empty pull lists each).
    groups: usize,
}

impl RemoteKv<'_> {
    /// An empty pull: tells the prefiller to release its blocks.
    fn release(&self) -> PullRequest {
        PullRequest {
            d_req_id: self.d_req_id.clone(),
            transfer_id: self.transfer_id.to_string(),
            blocks: vec![vec![]; self.groups],
        }
    }
}
