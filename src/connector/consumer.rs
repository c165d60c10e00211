//! The decode side: looks up prefill workers on the bootstrap server and
//! pulls KV by sending them pull messages over ZMQ DEALER sockets; the
//! prefillers write the blocks into this worker's registered memory and
//! reply.
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use super::bootstrap::{BootstrapClient, QueryTable, RetryPolicy};
use super::error::{ConnectorError, ConnectorErrorCode};
use super::protocol::{
    decode, encode, GroupBlocks, XferMetadata, XferResponse, XferStatus, MAX_PP_SIZE, MAX_TP_SIZE,
};
use super::regions::{check_tp_sizes, target_ranks};
use super::stats::ConnectorStats;
use super::worker::WorkerContext;
use super::zmtp_guard::{self, Limits};

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<String>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One request to pull.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullRequest {
    /// The decoder's request id.
    pub d_req_id: String,
    /// The id shared with the prefiller.
    pub transfer_id: String,
    /// Destination blocks per KV-cache group; all empty = release the
    /// prefiller's blocks without moving data.
    pub blocks: GroupBlocks,
}

/// The result of a pull.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullOutcome {
    /// Requests whose KV arrived from every paired prefill rank.
    pub ok: Vec<String>,
    /// Requests that failed, with the reason.
    pub failed: Vec<(String, String)>,
}

/// What a failed pull reports to the scheduler, as vLLM's connector does:
/// the request's block ids when the model has one KV-cache group, its
/// request id when it has several (block ids are only unique within a
/// group). Releases (empty pulls) report nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadFailure {
    /// Block ids whose KV did not arrive (one KV-cache group).
    Blocks(Vec<u64>),
    /// A request whose KV did not arrive (several groups).
    Request(String),
}

impl PullOutcome {
    /// The load failures of `reqs` (the requests this outcome answers), in
    /// vLLM's form: block ids, or request ids for hybrid models.
    pub fn load_failures(&self, reqs: &[PullRequest]) -> Vec<LoadFailure> {
        let failed: std::collections::HashSet<&str> =
            self.failed.iter().map(|(id, _)| id.as_str()).collect();
        reqs.iter()
            .filter(|r| failed.contains(r.d_req_id.as_str()))
            .filter(|r| r.blocks.iter().any(|g| !g.is_empty()))
            .map(|r| match r.blocks.as_slice() {
                [only] => LoadFailure::Blocks(only.clone()),
                _ => LoadFailure::Request(r.d_req_id.clone()),
            })
            .collect()
    }
}

/// A prefill engine as the bootstrap server describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteEngine {
    /// TP size (the number of TP ranks registered).
    pub tp_size: usize,
    /// PP size (the most PP stages any TP rank registered).
    pub pp_size: usize,
    /// tp rank → pp rank → side-channel address.
    pub workers: BTreeMap<usize, BTreeMap<usize, String>>,
}

/// A running consumer for one TP rank.
pub struct Consumer {
    ctx: Arc<WorkerContext>,
    bootstrap: BootstrapClient,
    engines: Mutex<HashMap<String, RemoteEngine>>,
    // One in-flight query per bootstrap address.
    queries: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Consumer {
    /// A consumer for the worker `ctx`.
    pub fn new(ctx: Arc<WorkerContext>) -> Self {
        let bootstrap = BootstrapClient::new(
            ctx.env
                .connector_timeout
                .min(ctx.env.bootstrap_query_timeout),
            RetryPolicy::default(),
        );
        Self {
            ctx,
            bootstrap,
            engines: Mutex::new(HashMap::new()),
            queries: Mutex::new(HashMap::new()),
        }
    }

    /// The prefill engine `engine_id`, from the cache or the bootstrap
    /// server at `bootstrap_addr` (a URL such as `http://host:8998`).
    pub async fn lookup(
        &self,
        bootstrap_addr: &str,
        engine_id: &str,
    ) -> Result<RemoteEngine, ConnectorError> {
        if let Some(e) = self.engines.lock().unwrap().get(engine_id) {
            return Ok(e.clone());
        }
        let gate = self
            .queries
            .lock()
            .unwrap()
            .entry(bootstrap_addr.to_string())
            .or_default()
            .clone();
        let _g = gate.lock().await;
        // Another task may have filled the cache meanwhile.
        if let Some(e) = self.engines.lock().unwrap().get(engine_id) {
            return Ok(e.clone());
        }
        // One bound for the whole lookup, retries included: a bootstrap
        // server that accepts and never answers must not hold the request.
        let limit = self.ctx.env.bootstrap_query_timeout;
        let table = tokio::time::timeout(limit, self.bootstrap.query(bootstrap_addr))
            .await
            .map_err(|_| {
                ConnectorError::new(
                    ConnectorErrorCode::Bootstrap,
                    format!(
                        "bootstrap server {bootstrap_addr} did not answer within {limit:?} \
                         (MOONCAKE_BOOTSTRAP_QUERY_TIMEOUT)"
                    ),
                )
            })??;
        self.cache_table(&table)?;
        self.engines.lock().unwrap().get(engine_id).cloned().ok_or_else(|| {
            ConnectorError::new(
                ConnectorErrorCode::Bootstrap,
                format!("remote engine_id {engine_id} not found from bootstrap server {bootstrap_addr} (or not every TP rank and PP stage has registered yet)"),
            )
        })
    }

    fn cache_table(&self, table: &QueryTable) -> Result<(), ConnectorError> {
        let found = engines_of(table)?;
        self.engines.lock().unwrap().extend(found);
        Ok(())
    }

    /// Pulls `reqs` from the prefill engine `engine_id`. Every request ends
    /// up in `ok` or in `failed` with a reason; nothing waits longer than the
    /// receive timeout (abort timeout + 60 s) per reply.
    pub async fn pull(
        &self,
        bootstrap_addr: &str,
        engine_id: &str,
        reqs: Vec<PullRequest>,
    ) -> PullOutcome {
        let ids: Vec<String> = reqs.iter().map(|r| r.d_req_id.clone()).collect();
        let fail_all = |why: String| PullOutcome {
            ok: vec![],
            failed: ids.iter().map(|d| (d.clone(), why.clone())).collect(),
        };
        let remote = match self.lookup(bootstrap_addr, engine_id).await {
            Ok(r) => r,
            Err(e) => {
                self.count(0, ids.len());
                return fail_all(e.detail);
            }
        };
        let layout = &self.ctx.layout;
        if let Err(e) = check_tp_sizes(remote.tp_size, layout.tp_size) {
            self.count(0, ids.len());
            return fail_all(e.detail);
        }
        // TP ranks by vLLM's pairing rule; PP stages: the same stage when
        // both sides split the layers alike, else every stage (each answers
        // for the layers it shares with this one).
        let stages: Vec<usize> = if remote.pp_size == layout.pp_size {
            vec![layout.pp_rank]
        } else {
            (0..remote.pp_size).collect()
        };
        let targets: Vec<(usize, usize)> =
            target_ranks(layout.tp_size, remote.tp_size, layout.tp_rank)
                .into_iter()
                .flat_map(|t| stages.iter().map(move |&s| (t, s)))
                .collect();
        let payload = Bytes::from(encode(&self.pull_metadata(&reqs)));
        let started = Instant::now();
        let per_rank = self.pull_from_ranks(&remote, &targets, payload, &ids).await;
        let out = merge_rank_results(&ids, &per_rank);
        self.record_outcome(&reqs, &out, engine_id, started);
        out
    }

    /// The pull message for `reqs`: where to write (this worker's layout)
    /// and which blocks each request wants.
    fn pull_metadata(&self, reqs: &[PullRequest]) -> XferMetadata {
        let mut meta = XferMetadata {
            remote_hostname: self.ctx.env.host_ip.clone(),
            remote_port: self.ctx.engine.rpc_port() as u64,
            remote_tp_size: 0,
            remote_tp_rank: 0,
            req_blocks: reqs
                .iter()
                .map(|r| {
                    (
                        r.d_req_id.clone(),
                        (r.transfer_id.clone(), r.blocks.clone()),
                    )
                })
                .collect(),
            kv_caches_base_addr: vec![],
            block_lens: vec![],
            kv_block_lens: vec![],
            registered_layer_names: vec![],
            registered_layer_indices: vec![],
            registered_group_indices: vec![],
            remote_pp_size: 1,
        };
        // Sets remote_tp_size/rank, remote_pp_size and the regions.
        self.ctx.layout.fill_metadata(&mut meta);
        meta
    }

    /// Sends `payload` to every prefill rank in `targets` at once; the
    /// per-request results of each, in the order of `targets`.
    async fn pull_from_ranks(
        &self,
        remote: &RemoteEngine,
        targets: &[(usize, usize)],
        payload: Bytes,
        ids: &[String],
    ) -> Vec<Results> {
        futures::future::join_all(targets.iter().map(|&(p_rank, p_stage)| {
            let addr = remote
                .workers
                .get(&p_rank)
                .and_then(|pps| pps.get(&p_stage))
                .cloned();
            let payload = payload.clone();
            async move {
                match addr {
                    None => ids
                        .iter()
                        .map(|d| {
                            (
                                d.clone(),
                                Err(format!(
                                    "P tp_rank {p_rank} pp_rank {p_stage} is not registered"
                                )),
                            )
                        })
                        .collect(),
                    Some(addr) => self.pull_from(p_rank, &addr, payload, ids).await,
                }
            }
        }))
        .await
    }

    /// Counts and logs the outcome of one pull.
    fn record_outcome(
        &self,
        reqs: &[PullRequest],
        out: &PullOutcome,
        engine_id: &str,
        started: Instant,
    ) {
        let bytes: u64 = reqs
            .iter()
            .filter(|r| out.ok.contains(&r.d_req_id))
            .map(|r| self.kv_bytes(&r.blocks))
            .sum();
        ConnectorStats::add(&self.ctx.stats.bytes_received, bytes);
        self.count(out.ok.len(), out.failed.len());
        for (id, why) in &out.failed {
            tracing::warn!(target: "mooncake_connector::consumer", request = %id, engine = engine_id, "KV pull failed: {why}");
        }
        if !out.ok.is_empty() {
            tracing::info!(target: "mooncake_connector::consumer", engine = engine_id, requests = out.ok.len(), bytes,
                ms = started.elapsed().as_secs_f64() * 1e3, "KV received");
        }
    }

    /// The KV bytes `blocks` (ids per group) cover in this worker's
    /// regions, storage shared by several layers counted once.
    fn kv_bytes(&self, blocks: &GroupBlocks) -> u64 {
        let mut seen = std::collections::HashSet::new();
        self.ctx
            .layout
            .regions
            .iter()
            .filter(|r| seen.insert((r.base, r.group_index)))
            .map(|r| {
                let n = usize::try_from(r.group_index)
                    .ok()
                    .and_then(|g| blocks.get(g))
                    .map_or(0, Vec::len);
                n as u64 * r.kv_block_len
            })
            .sum()
    }

    fn count(&self, ok: usize, failed: usize) {
        ConnectorStats::add(&self.ctx.stats.pulls_ok, ok as u64);
        ConnectorStats::add(&self.ctx.stats.pulls_failed, failed as u64);
    }

    /// One pull message to one prefill rank; the per-request results.
    async fn pull_from(
        &self,
        p_rank: usize,
        addr: &str,
        payload: Bytes,
        ids: &[String],
    ) -> Results {
        let mut results = Results::new();
        match self.open_side_channel(p_rank, addr, payload).await {
            Ok((mut relay, mut sock)) => {
                self.receive_replies(&mut sock, &mut relay, p_rank, addr, ids, &mut results)
                    .await;
            }
            Err(why) => fail_rest(&mut results, ids, why),
        }
        results
    }

    /// Connects a DEALER to the prefill rank at `addr` and sends it the pull
    /// message; the relay task and the socket, or why that failed.
    async fn open_side_channel(
        &self,
        p_rank: usize,
        addr: &str,
        payload: Bytes,
    ) -> Result<(AbortOnDrop, zeromq::DealerSocket), String> {
        // The DEALER talks to the prefiller through a bounded relay, so a
        // hostile prefiller cannot make it allocate an announced frame size.
        let limits = Limits {
            max_message: self.ctx.env.side_channel_max_message,
            idle: self.ctx.env.receive_timeout(),
        };
        let (local, relay) = zmtp_guard::outgoing(addr, self.ctx.env.connector_timeout, limits)
            .await
            .map_err(|e| format!("P tp_rank {p_rank}: {e}"))?;
        let mut relay = AbortOnDrop(relay);
        let mut sock = zeromq::DealerSocket::new();
        match tokio::time::timeout(self.ctx.env.connector_timeout, sock.connect(&local)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                // The relay may have dropped the peer: say why.
                let why = match tokio::time::timeout(Duration::from_millis(200), &mut relay.0).await
                {
                    Ok(Ok(why)) => format!("{e}; {why}"),
                    _ => e.to_string(),
                };
                return Err(format!(
                    "cannot connect to P tp_rank {p_rank} at {addr}: {why}"
                ));
            }
            Err(_) => {
                return Err(format!(
                    "connecting to P tp_rank {p_rank} at {addr} timed out"
                ));
            }
        }
        if let Err(e) = sock.send(ZmqMessage::from(payload)).await {
            return Err(format!(
                "sending the pull to P tp_rank {p_rank} at {addr}: {e}"
            ));
        }
        Ok((relay, sock))
    }

    /// Reads replies from the prefill rank until every request in `ids` has
    /// a result, filling `results`.
    async fn receive_replies(
        &self,
        sock: &mut zeromq::DealerSocket,
        relay: &mut AbortOnDrop,
        p_rank: usize,
        addr: &str,
        ids: &[String],
        results: &mut Results,
    ) {
        let timeout = self.ctx.env.receive_timeout();
        let mut relay_ended: Option<String> = None;
        loop {
            // A relay that ended (the prefiller closed, or was dropped for
            // breaking the limits) fails the pull now, after a short grace
            // for a reply already on its way.
            let wait = if relay_ended.is_some() {
                Duration::from_millis(200)
            } else {
                timeout
            };
            let watch_relay = relay_ended.is_none();
            let got = tokio::select! {
                biased;
                r = tokio::time::timeout(wait, sock.recv()) => Some(r),
                why = &mut relay.0, if watch_relay => {
                    relay_ended = Some(why.unwrap_or_else(|e| e.to_string()));
                    None
                }
            };
            let Some(got) = got else { continue };
            let msg = match received_reply(got, relay_ended.as_deref(), p_rank, addr, timeout) {
                Ok(m) => m,
                Err(why) => {
                    fail_rest(results, ids, why);
                    break;
                }
            };
            let frames = msg.into_vec();
            let Some(last) = frames.last() else { continue };
            if let Some(why) = apply_reply(last, p_rank, ids, results) {
                fail_rest(results, ids, why);
                break;
            }
        }
    }
}

/// The prefill engines of a bootstrap table whose topology is complete
/// (TP ranks 0..tp, each with PP ranks 0..pp, within the protocol's
/// bounds); Err on a malformed rank.
fn engines_of(table: &QueryTable) -> Result<Vec<(String, RemoteEngine)>, ConnectorError> {
    let mut engines = Vec::new();
    for (dp, entry) in table {
        let mut workers = BTreeMap::new();
        for (tp, pps) in &entry.worker_addr {
            let tp: usize = tp.parse().map_err(|_| {
                ConnectorError::new(
                    ConnectorErrorCode::Protocol,
                    format!("bootstrap table: dp {dp} has tp rank {tp:?}"),
                )
            })?;
            let mut m = BTreeMap::new();
            for (pp, addr) in pps {
                let pp: usize = pp.parse().map_err(|_| {
                    ConnectorError::new(
                        ConnectorErrorCode::Protocol,
                        format!("bootstrap table: tp {tp} has pp rank {pp:?}"),
                    )
                })?;
                m.insert(pp, addr.clone());
            }
            workers.insert(tp, m);
        }
        // Only a complete topology is cached: TP ranks 0..tp, each with
        // PP ranks 0..pp. A table read while a prefiller's stages were
        // still registering would otherwise fix a wrong TP or PP size
        // for good (and a PP-1 decoder would pull one stage's layers
        // and call it done). The lookup fails; a later one asks again.
        let tp_size = workers.len();
        let pp_size = workers.values().map(|m| m.len()).max().unwrap_or(0);
        let complete = (1..=MAX_TP_SIZE as usize).contains(&tp_size)
            && (1..=MAX_PP_SIZE as usize).contains(&pp_size)
            && workers.keys().copied().eq(0..tp_size)
            && workers.values().all(|m| m.keys().copied().eq(0..pp_size));
        if !complete {
            tracing::warn!(target: "mooncake_connector::consumer", engine = %entry.engine_id,
                "bootstrap table: engine {} has an incomplete or oversized topology (TP ranks {:?}); not cached",
                entry.engine_id, workers.keys().take(8).collect::<Vec<_>>());
            continue;
        }
        engines.push((
            entry.engine_id.clone(),
            RemoteEngine {
                tp_size,
                pp_size,
                workers,
            },
        ));
    }
    Ok(engines)
}

/// The per-request results of one prefill rank.
type Results = HashMap<String, Result<(), String>>;

/// Fails, with `why`, every request in `ids` that has no result yet.
fn fail_rest(results: &mut Results, ids: &[String], why: String) {
    for id in ids {
        results
            .entry(id.clone())
            .or_insert_with(|| Err(why.clone()));
    }
}

/// A request is done when every targeted prefill rank reported it ok.
fn merge_rank_results(ids: &[String], per_rank: &[Results]) -> PullOutcome {
    let mut out = PullOutcome::default();
    for id in ids {
        let mut why = None;
        for results in per_rank {
            match results.get(id) {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    why.get_or_insert_with(|| e.clone());
                }
                None => {
                    why.get_or_insert_with(|| "no result from the prefill side".to_string());
                }
            }
        }
        match why {
            None => out.ok.push(id.clone()),
            Some(w) => out.failed.push((id.clone(), w)),
        }
    }
    out
}

/// The message a receive with timeout produced, or why the side channel is
/// over (`relay_ended` is why the relay stopped, if it did).
fn received_reply(
    got: Result<Result<ZmqMessage, zeromq::ZmqError>, tokio::time::error::Elapsed>,
    relay_ended: Option<&str>,
    p_rank: usize,
    addr: &str,
    timeout: Duration,
) -> Result<ZmqMessage, String> {
    match (got, relay_ended) {
        (Err(_), Some(why)) => Err(format!(
            "side channel to P tp_rank {p_rank} at {addr} ended: {why}"
        )),
        (Ok(Ok(m)), _) => Ok(m),
        (Ok(Err(e)), _) => Err(format!(
            "side channel to P tp_rank {p_rank} at {addr} failed: {e}"
        )),
        (Err(_), None) => Err(format!(
            "no reply from P tp_rank {p_rank} at {addr} within {timeout:?}"
        )),
    }
}

/// Applies one reply (its last frame) to `results`; `Some(why)` when the
/// prefill rank is done and the requests still without a result fail with
/// `why`.
fn apply_reply(
    last: &[u8],
    p_rank: usize,
    ids: &[String],
    results: &mut Results,
) -> Option<String> {
    let resp: XferResponse = match decode("MooncakeXferResponse", last) {
        Ok(r) => r,
        Err(e) => return Some(e.detail),
    };
    let msg = resp
        .err_msg
        .clone()
        .unwrap_or_else(|| "failed on the prefill side".into());
    if resp.status == XferStatus::Error {
        return Some(format!("P tp_rank {p_rank}: {msg}"));
    }
    // Only the requests we asked for count: a peer cannot grow the result
    // map with made-up ids.
    for id in resp.ok_reqs.unwrap_or_default() {
        if ids.contains(&id) {
            results.insert(id, Ok(()));
        }
    }
    for id in resp.err_reqs.unwrap_or_default() {
        if ids.contains(&id) {
            results.insert(id, Err(format!("P tp_rank {p_rank}: {msg}")));
        }
    }
    if resp.status == XferStatus::Finish {
        return Some(format!(
            "P tp_rank {p_rank} finished without reporting the request"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: &str, blocks: GroupBlocks) -> PullRequest {
        PullRequest {
            d_req_id: id.into(),
            transfer_id: format!("xfer-{id}"),
            blocks,
        }
    }

    /// (TP rank, its PP ranks) of one engine.
    type Ranks<'a> = &'a [(&'a str, &'a [&'a str])];

    fn table(entries: &[(&str, Ranks<'_>)]) -> QueryTable {
        let mut t = QueryTable::new();
        for (dp, (engine, ranks)) in entries.iter().enumerate() {
            let worker_addr = ranks
                .iter()
                .map(|(tp, pps)| {
                    let m = pps
                        .iter()
                        .map(|pp| (pp.to_string(), format!("tcp://127.0.0.1:{}", 5000 + dp)))
                        .collect();
                    (tp.to_string(), m)
                })
                .collect();
            t.insert(
                dp.to_string(),
                crate::connector::bootstrap::DpEntry {
                    engine_id: engine.to_string(),
                    worker_addr,
                },
            );
        }
        t
    }

    #[test]
    fn only_complete_topologies_are_cached() {
        let t = table(&[
            ("full", &[("0", &["0", "1"]), ("1", &["0", "1"])]),
            // Stage 1 of TP rank 1 not registered yet.
            ("half", &[("0", &["0", "1"]), ("1", &["0"])]),
            // TP rank 0 missing.
            ("gap", &[("1", &["0"])]),
        ]);
        let found = engines_of(&t).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, "full");
        assert_eq!((found[0].1.tp_size, found[0].1.pp_size), (2, 2));
        // More PP stages than a pull may name (65) is not cached either.
        let stages: Vec<String> = (0..65).map(|i| i.to_string()).collect();
        let stages: Vec<&str> = stages.iter().map(String::as_str).collect();
        assert!(engines_of(&table(&[("deep", &[("0", &stages)])]))
            .unwrap()
            .is_empty());
        // A rank that is not a number is a protocol error.
        let bad = table(&[("x", &[("zero", &["0"])])]);
        assert!(engines_of(&bad).is_err());
    }

    #[test]
    fn load_failures_name_blocks_or_requests_as_vllm_does() {
        let out = PullOutcome {
            ok: vec!["a".into()],
            failed: vec![
                ("b".into(), "x".into()),
                ("c".into(), "y".into()),
                ("r".into(), "z".into()),
            ],
        };
        let reqs = [
            req("a", vec![vec![1, 2]]),
            req("b", vec![vec![3, 4]]),
            req("c", vec![vec![5], vec![9]]),
            req("r", vec![vec![], vec![]]),
        ];
        assert_eq!(
            out.load_failures(&reqs),
            [
                LoadFailure::Blocks(vec![3, 4]),
                LoadFailure::Request("c".into())
            ]
        );
    }
}
