//! The bootstrap server (embedded in the prefiller's rank 0) and its client:
//! prefill workers register their side-channel addresses, decoders look them
//! up. JSON shapes, status codes and conflict rules follow vLLM's
//! MooncakeConnector.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::error::{ConnectorError, ConnectorErrorCode};

/// `POST /register` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterRequest {
    /// The prefill engine's id.
    pub engine_id: String,
    /// Data-parallel rank.
    pub dp_rank: u32,
    /// Tensor-parallel rank.
    pub tp_rank: u32,
    /// Pipeline-parallel rank.
    pub pp_rank: u32,
    /// The worker's ZMQ side-channel endpoint, `tcp://<ip>:<port>`.
    pub addr: String,
}

/// One data-parallel rank in the `/query` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DpEntry {
    /// The engine id that owns this DP rank.
    pub engine_id: String,
    /// tp rank → pp rank → side-channel address (JSON keys are strings).
    pub worker_addr: BTreeMap<String, BTreeMap<String, String>>,
}

/// The `/query` answer: DP rank (as a string) → entry.
pub type QueryTable = BTreeMap<String, DpEntry>;

/// The topology a server must see before `/query` answers, so that a
/// decoder never derives a wrong TP size from a half-registered table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpectedTopology {
    /// DP ranks.
    pub dp_size: u32,
    /// TP ranks per DP rank.
    pub tp_size: u32,
    /// PP ranks per TP rank.
    pub pp_size: u32,
}

/// tp rank → pp rank → side-channel address.
type Workers = BTreeMap<u32, BTreeMap<u32, String>>;

#[derive(Default)]
struct Table {
    // dp rank -> (engine id, workers)
    entries: BTreeMap<u32, (String, Workers)>,
}

struct ServerState {
    table: Mutex<Table>,
    expected: Option<ExpectedTopology>,
}

impl ServerState {
    fn register(&self, r: &RegisterRequest) -> Result<bool, String> {
        let mut t = self.table.lock().unwrap();
        let entry = t
            .entries
            .entry(r.dp_rank)
            .or_insert_with(|| (r.engine_id.clone(), BTreeMap::new()));
        if entry.0 != r.engine_id {
            return Err(format!(
                "dp_rank {} is already registered by engine_id {}, not {}",
                r.dp_rank, entry.0, r.engine_id
            ));
        }
        let slot = entry.1.entry(r.tp_rank).or_default();
        match slot.get(&r.pp_rank) {
            Some(existing) if *existing == r.addr => Ok(false), // idempotent retry
            Some(existing) => Err(format!(
                "dp_rank {} tp_rank {} pp_rank {} is already registered with addr {}, not {}",
                r.dp_rank, r.tp_rank, r.pp_rank, existing, r.addr
            )),
            None => {
                slot.insert(r.pp_rank, r.addr.clone());
                Ok(true)
            }
        }
    }

    fn missing(&self) -> Option<String> {
        let e = self.expected?;
        let t = self.table.lock().unwrap();
        for dp in 0..e.dp_size {
            let Some((_, tps)) = t.entries.get(&dp) else {
                return Some(format!("dp_rank {dp} has not registered"));
            };
            for tp in 0..e.tp_size {
                for pp in 0..e.pp_size {
                    if !tps.get(&tp).is_some_and(|p| p.contains_key(&pp)) {
                        return Some(format!(
                            "dp_rank {dp} tp_rank {tp} pp_rank {pp} has not registered"
                        ));
                    }
                }
            }
        }
        None
    }

    fn snapshot(&self) -> QueryTable {
        let t = self.table.lock().unwrap();
        t.entries
            .iter()
            .map(|(dp, (engine_id, tps))| {
                let worker_addr = tps
                    .iter()
                    .map(|(tp, pps)| {
                        (
                            tp.to_string(),
                            pps.iter()
                                .map(|(pp, a)| (pp.to_string(), a.clone()))
                                .collect(),
                        )
                    })
                    .collect();
                (
                    dp.to_string(),
                    DpEntry {
                        engine_id: engine_id.clone(),
                        worker_addr,
                    },
                )
            })
            .collect()
    }
}

fn detail(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(json!({ "detail": msg.into() }))).into_response()
}

async fn register_handler(
    State(state): State<Arc<ServerState>>,
    body: Result<Json<RegisterRequest>, JsonRejection>,
) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        // FastAPI answers a malformed body with 422.
        Err(e) => return detail(StatusCode::UNPROCESSABLE_ENTITY, e.body_text()),
    };
    match state.register(&req) {
        Ok(new) => {
            if new {
                tracing::info!(target: "mooncake_connector::bootstrap", engine_id = %req.engine_id,
                    dp = req.dp_rank, tp = req.tp_rank, pp = req.pp_rank, addr = %req.addr, "worker registered");
            }
            (StatusCode::OK, Json(json!({"status": "ok"}))).into_response()
        }
        Err(why) => {
            tracing::warn!(target: "mooncake_connector::bootstrap", "registration refused: {why}");
            detail(StatusCode::BAD_REQUEST, why)
        }
    }
}

async fn query_handler(State(state): State<Arc<ServerState>>) -> Response {
    if let Some(missing) = state.missing() {
        return detail(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("topology incomplete: {missing}"),
        );
    }
    (StatusCode::OK, Json(state.snapshot())).into_response()
}

/// A running bootstrap server.
pub struct BootstrapServer {
    addr: SocketAddr,
    state: Arc<ServerState>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl BootstrapServer {
    /// Binds `bind` (bound before returning, so a port clash is an error
    /// here, not later) and serves in the background.
    pub async fn start(
        bind: SocketAddr,
        expected: Option<ExpectedTopology>,
    ) -> Result<Self, ConnectorError> {
        let listener = tokio::net::TcpListener::bind(bind).await.map_err(|e| {
            ConnectorError::new(
                ConnectorErrorCode::Bootstrap,
                format!("cannot bind the bootstrap server to {bind}: {e} (is VLLM_MOONCAKE_BOOTSTRAP_PORT in use?)"),
            )
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| ConnectorError::new(ConnectorErrorCode::Bootstrap, e.to_string()))?;
        let state = Arc::new(ServerState {
            table: Mutex::new(Table::default()),
            expected,
        });
        let app = Router::new()
            .route("/register", post(register_handler))
            .route("/query", get(query_handler))
            .with_state(state.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app).with_graceful_shutdown(async {
                let _ = rx.await;
            });
            if let Err(e) = served.await {
                tracing::error!(target: "mooncake_connector::bootstrap", "bootstrap server stopped: {e}");
            }
        });
        tracing::info!(target: "mooncake_connector::bootstrap", %addr, "bootstrap server listening");
        Ok(Self {
            addr,
            state,
            shutdown: Some(tx),
            task: Some(task),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL, `http://host:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The current table (whatever its completeness).
    pub fn table(&self) -> QueryTable {
        self.state.snapshot()
    }

    /// Stops serving.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for BootstrapServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// When and how often a bootstrap call is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all (vLLM: 3).
    pub attempts: u32,
    /// Delay after the first failed attempt (vLLM: 1 s), doubled after each.
    pub initial_backoff: Duration,
    /// Cap on the delay (vLLM: 10 s).
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 3,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// The delays between attempts: `attempts - 1` values.
    pub fn delays(&self) -> Vec<Duration> {
        let mut d = self.initial_backoff;
        let mut out = Vec::new();
        for _ in 1..self.attempts {
            out.push(d.min(self.max_backoff));
            d = (d * 2).min(self.max_backoff);
        }
        out
    }
}

/// The client for `/register` and `/query`.
#[derive(Clone)]
pub struct BootstrapClient {
    http: reqwest::Client,
    timeout: Duration,
    retry: RetryPolicy,
}

fn transient(e: &reqwest::Error) -> bool {
    e.is_connect() || e.is_timeout()
}

impl BootstrapClient {
    /// A client whose every request is bounded by `timeout`
    /// (`VLLM_MOONCAKE_CONNECTOR_TIMEOUT`).
    pub fn new(timeout: Duration, retry: RetryPolicy) -> Self {
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("reqwest client");
        Self {
            http,
            timeout,
            retry,
        }
    }

    async fn with_retries<T, F, Fut>(&self, what: &str, mut call: F) -> Result<T, ConnectorError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, CallError>>,
    {
        let delays = self.retry.delays();
        let mut last = String::new();
        for attempt in 0..self.retry.attempts.max(1) {
            match call().await {
                Ok(v) => return Ok(v),
                Err(CallError::Fatal(e)) => return Err(e),
                Err(CallError::Transient(why)) => {
                    last = why;
                    let left = self.retry.attempts.saturating_sub(attempt + 1);
                    if let Some(d) = delays.get(attempt as usize).filter(|_| left > 0) {
                        tracing::warn!(target: "mooncake_connector::bootstrap",
                            "{what} attempt {} failed ({last}); retrying in {:?}", attempt + 1, d);
                        tokio::time::sleep(*d).await;
                    }
                }
            }
        }
        Err(ConnectorError::new(
            ConnectorErrorCode::Bootstrap,
            format!(
                "{what} failed after {} attempts: {last}",
                self.retry.attempts
            ),
        ))
    }

    /// Registers a worker at `base_url` (`http://host:port`).
    pub async fn register(
        &self,
        base_url: &str,
        req: &RegisterRequest,
    ) -> Result<(), ConnectorError> {
        let url = format!("{}/register", base_url.trim_end_matches('/'));
        let what = format!("bootstrap registration at {url}");
        self.with_retries(&what, || async {
            let resp = self
                .http
                .post(&url)
                .timeout(self.timeout)
                .json(req)
                .send()
                .await
                .map_err(|e| classify(&url, e))?;
            let status = resp.status();
            if status.is_success() {
                return Ok(());
            }
            let body = resp.text().await.unwrap_or_default();
            Err(CallError::Fatal(ConnectorError::new(
                ConnectorErrorCode::Bootstrap,
                format!("POST {url} returned {status}: {body}"),
            )))
        })
        .await
    }

    /// Fetches the table from `base_url`. Like vLLM's client, an HTTP error
    /// (a 503 for an incomplete topology included) is not retried.
    pub async fn query(&self, base_url: &str) -> Result<QueryTable, ConnectorError> {
        let url = format!("{}/query", base_url.trim_end_matches('/'));
        let what = format!("bootstrap query at {url}");
        self.with_retries(&what, || async {
            let resp = self
                .http
                .get(&url)
                .timeout(self.timeout)
                .send()
                .await
                .map_err(|e| classify(&url, e))?;
            let status = resp.status();
            if !status.is_success() {
                let body = resp.text().await.unwrap_or_default();
                return Err(CallError::Fatal(ConnectorError::new(
                    ConnectorErrorCode::Bootstrap,
                    format!("GET {url} returned {status}: {body}"),
                )));
            }
            resp.json::<QueryTable>().await.map_err(|e| {
                CallError::Fatal(ConnectorError::new(
                    ConnectorErrorCode::Protocol,
                    format!("GET {url}: the answer is not a bootstrap table: {e}"),
                ))
            })
        })
        .await
    }
}

enum CallError {
    Transient(String),
    Fatal(ConnectorError),
}

fn classify(url: &str, e: reqwest::Error) -> CallError {
    if transient(&e) {
        CallError::Transient(if e.is_timeout() {
            format!("timed out: {e}")
        } else {
            format!("cannot connect: {e}")
        })
    } else {
        CallError::Fatal(ConnectorError::new(
            ConnectorErrorCode::Bootstrap,
            format!("{url}: {e}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_schedule_matches_vllm() {
        assert_eq!(
            RetryPolicy::default().delays(),
            [Duration::from_secs(1), Duration::from_secs(2)]
        );
        let long = RetryPolicy {
            attempts: 7,
            ..RetryPolicy::default()
        };
        assert_eq!(
            long.delays()
                .iter()
                .map(|d| d.as_secs())
                .collect::<Vec<_>>(),
            [1, 2, 4, 8, 10, 10]
        );
    }
}
