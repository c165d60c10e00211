//! The bootstrap server (embedded in the prefiller's rank 0) and its client:
//! prefill workers register their side-channel addresses, decoders look them
//! up. JSON shapes, status codes and conflict rules follow vLLM's
//! MooncakeConnector.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::error::{ConnectorError, ConnectorErrorCode};

/// `POST /register` body. Besides vLLM's five fields it carries the newer
/// body's `tp_size`/`pp_size` (vLLM's newer server needs `tp_size` for a
/// TP > 1 registration) and our `dp_size`, which a vLLM server ignores.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The engine's TP size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp_size: Option<u32>,
    /// The engine's PP size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pp_size: Option<u32>,
    /// How many DP ranks the cluster has (an extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_size: Option<u32>,
}

/// Largest request body `/register` reads.
pub const MAX_BODY: usize = 16 * 1024;
/// Longest engine id.
pub const MAX_ENGINE_ID: usize = 128;
/// Largest TP size a registration may announce.
pub const MAX_TP: u32 = 1024;
/// Largest PP size a registration may announce.
pub const MAX_PP: u32 = 64;
/// Most DP ranks the table holds.
pub const MAX_DP_RANKS: usize = 256;
/// Most workers the table holds.
pub const MAX_WORKERS: usize = 4096;
/// Environment variable holding the optional shared registration token.
pub const TOKEN_ENV: &str = "MOONCAKE_BOOTSTRAP_TOKEN";

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
    // dp rank -> announced (tp_size, pp_size)
    sizes: BTreeMap<u32, (Option<u32>, Option<u32>)>,
    dp_size: Option<u32>,
    workers: usize,
}

struct ServerState {
    table: Mutex<Table>,
    expected: Option<ExpectedTopology>,
    token: Option<String>,
}

/// Why a registration was refused: the status and the detail.
type Refusal = (StatusCode, String);

/// What a registration would do to the table.
enum Outcome {
    New,
    Same,
    /// The slot holds another address: allowed only if that worker is gone.
    Replace(String),
}

fn bad(msg: impl Into<String>) -> Refusal {
    (StatusCode::BAD_REQUEST, msg.into())
}

/// A registration that contradicts a live entry. vLLM's bootstrap server
/// answers these with 400 too, and its workers only log the detail.
fn conflict(msg: impl Into<String>) -> Refusal {
    (StatusCode::BAD_REQUEST, msg.into())
}

/// Checks a registration on its own: ids, address, ranks and sizes.
fn validate(r: &RegisterRequest, e: Option<ExpectedTopology>) -> Result<(), Refusal> {
    if r.engine_id.is_empty()
        || r.engine_id.len() > MAX_ENGINE_ID
        || !r
            .engine_id
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"._:-".contains(&c))
    {
        return Err(bad(format!(
            "engine_id must be 1..={MAX_ENGINE_ID} characters of [A-Za-z0-9._:-]"
        )));
    }
    parse_side_channel(&r.addr).map_err(bad)?;
    let tp_size = r.tp_size.or(e.map(|e| e.tp_size));
    let pp_size = r.pp_size.or(e.map(|e| e.pp_size));
    let dp_size = r.dp_size.or(e.map(|e| e.dp_size));
    for (what, v, max) in [
        ("tp_size", tp_size, MAX_TP),
        ("pp_size", pp_size, MAX_PP),
        ("dp_size", dp_size, MAX_DP_RANKS as u32),
    ] {
        if let Some(v) = v {
            if v == 0 || v > max {
                return Err(bad(format!("{what}={v} is not in 1..={max}")));
            }
        }
    }
    for (what, rank, size, max) in [
        ("tp_rank", r.tp_rank, tp_size, MAX_TP),
        ("pp_rank", r.pp_rank, pp_size, MAX_PP),
        ("dp_rank", r.dp_rank, dp_size, MAX_DP_RANKS as u32),
    ] {
        let limit = size.unwrap_or(max);
        if rank >= limit {
            return Err(bad(format!("{what}={rank} is outside [0, {limit})")));
        }
    }
    if let (Some(a), Some(b)) = (r.dp_size, e.map(|e| e.dp_size)) {
        if a != b {
            return Err(conflict(format!(
                "dp_size={a}, but this server serves dp_size={b}"
            )));
        }
    }
    if let (Some(a), Some(b)) = (r.tp_size, e.map(|e| e.tp_size)) {
        if a != b {
            return Err(conflict(format!(
                "tp_size={a}, but this server serves tp_size={b}"
            )));
        }
    }
    Ok(())
}

/// `tcp://host:port` with an IP address or host name and a real port.
pub fn parse_side_channel(addr: &str) -> Result<(String, u16), String> {
    let bad = || format!("addr must be tcp://<host>:<port>, got {:?}", truncate(addr));
    if addr.len() > 300 {
        return Err(bad());
    }
    let hp = addr.strip_prefix("tcp://").ok_or_else(bad)?;
    let (host, port) = hp.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0).ok_or_else(bad)?;
    let ok_host = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'-')
    };
    if !ok_host {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

impl ServerState {
    /// What registering `r` would do, or why it is refused.
    fn check(&self, r: &RegisterRequest) -> Result<Outcome, Refusal> {
        let t = self.table.lock().unwrap();
        if let (Some(a), Some(b)) = (r.dp_size, t.dp_size) {
            if a != b {
                return Err(conflict(format!(
                    "dp_size={a}, but dp_size={b} was announced"
                )));
            }
        }
        if let Some(n) = t.dp_size.or(self.expected.map(|e| e.dp_size)) {
            if r.dp_rank >= n {
                return Err(bad(format!("dp_rank={} is outside [0, {n})", r.dp_rank)));
            }
        }
        let Some((engine_id, workers)) = t.entries.get(&r.dp_rank) else {
            if t.entries.len() >= MAX_DP_RANKS || t.workers >= MAX_WORKERS {
                return Err(bad("the bootstrap table is full"));
            }
            return Ok(Outcome::New);
        };
        if *engine_id != r.engine_id {
            return Err(bad(format!(
                "dp_rank {} is already registered by engine_id {engine_id}, not {}",
                r.dp_rank, r.engine_id
            )));
        }
        let (tp_size, pp_size) = t.sizes.get(&r.dp_rank).copied().unwrap_or_default();
        for (what, mine, theirs, rank) in [
            ("tp", tp_size, r.tp_size, r.tp_rank),
            ("pp", pp_size, r.pp_size, r.pp_rank),
        ] {
            if let Some(n) = mine {
                if theirs.is_some_and(|m| m != n) || rank >= n {
                    return Err(conflict(format!(
                        "engine_id {} dp_rank {} registered {what}_size={n}; got {what}_size={} {what}_rank={rank}",
                        r.engine_id,
                        r.dp_rank,
                        theirs.map_or("unset".to_string(), |m| m.to_string())
                    )));
                }
            }
        }
        match workers.get(&r.tp_rank).and_then(|p| p.get(&r.pp_rank)) {
            Some(existing) if *existing == r.addr => Ok(Outcome::Same),
            Some(existing) => Ok(Outcome::Replace(existing.clone())),
            None if t.workers >= MAX_WORKERS => Err(bad("the bootstrap table is full")),
            None => Ok(Outcome::New),
        }
    }

    /// Records `r`; `replacing` is the address it may replace.
    fn commit(&self, r: &RegisterRequest, replacing: Option<&str>) -> Result<(), Refusal> {
        let mut t = self.table.lock().unwrap();
        let t = &mut *t;
        if let Some(n) = r.dp_size {
            t.dp_size.get_or_insert(n);
        }
        let entry = t
            .entries
            .entry(r.dp_rank)
            .or_insert_with(|| (r.engine_id.clone(), BTreeMap::new()));
        if entry.0 != r.engine_id {
            return Err(bad(format!(
                "dp_rank {} is already registered by engine_id {}, not {}",
                r.dp_rank, entry.0, r.engine_id
            )));
        }
        let sizes = t.sizes.entry(r.dp_rank).or_default();
        if sizes.0.is_none() {
            sizes.0 = r.tp_size;
        }
        if sizes.1.is_none() {
            sizes.1 = r.pp_size;
        }
        let slot = entry.1.entry(r.tp_rank).or_default();
        match (slot.get(&r.pp_rank), replacing) {
            (None, _) => t.workers += 1,
            (Some(cur), Some(old)) if cur == old => {}
            (Some(cur), _) if *cur == r.addr => return Ok(()),
            (Some(cur), _) => {
                return Err(conflict(format!(
                "dp_rank {} tp_rank {} pp_rank {} is already registered with addr {cur}, not {}",
                r.dp_rank, r.tp_rank, r.pp_rank, r.addr
            )))
            }
        }
        slot.insert(r.pp_rank, r.addr.clone());
        Ok(())
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

/// A validation error in FastAPI's 422 shape.
fn field_error(
    kind: &str,
    loc: &[serde_json::Value],
    msg: &str,
    input: &serde_json::Value,
) -> serde_json::Value {
    let mut l = vec![json!("body")];
    l.extend_from_slice(loc);
    json!({"type": kind, "loc": l, "msg": msg, "input": input})
}

/// An int the way pydantic's lax mode takes it: a JSON integer, a float
/// with no fraction, or a string holding an integer.
fn lax_int(v: &serde_json::Value) -> Result<i64, (&'static str, &'static str)> {
    const PARSE: (&str, &str) = (
        "int_parsing",
        "Input should be a valid integer, unable to parse string as an integer",
    );
    match v {
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Ok(i)
            } else if let Some(f) = n.as_f64() {
                if f.fract() == 0.0 && f.abs() < 9.0e15 {
                    Ok(f as i64)
                } else if f.fract() != 0.0 {
                    Err((
                        "int_from_float",
                        "Input should be a valid integer, got a number with a fractional part",
                    ))
                } else {
                    Err(PARSE)
                }
            } else {
                Err(PARSE)
            }
        }
        serde_json::Value::String(s) => s.trim().parse::<i64>().map_err(|_| PARSE),
        serde_json::Value::Bool(b) => Ok(i64::from(*b)),
        _ => Err(("int_type", "Input should be a valid integer")),
    }
}

/// Parses a `/register` body as vLLM's pydantic model would: Err is the
/// status and the JSON answer (422 in FastAPI's shape, or 400 for ranks and
/// sizes out of range).
pub fn parse_register(body: &[u8]) -> Result<RegisterRequest, (u16, serde_json::Value)> {
    let v: serde_json::Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return Err((
                422,
                json!({"detail": [{"type": "json_invalid", "loc": ["body", e.column()],
                    "msg": "JSON decode error", "input": {}, "ctx": {"error": e.to_string()}}]}),
            ))
        }
    };
    let Some(obj) = v.as_object() else {
        return Err((
            422,
            json!({"detail": [field_error("model_attributes_type", &[],
                "Input should be a valid dictionary or object to extract fields from", &v)]}),
        ));
    };
    let mut errors = Vec::new();
    let mut string = |key: &str| match obj.get(key) {
        None => {
            errors.push(field_error("missing", &[json!(key)], "Field required", &v));
            String::new()
        }
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => {
            errors.push(field_error(
                "string_type",
                &[json!(key)],
                "Input should be a valid string",
                other,
            ));
            String::new()
        }
    };
    let engine_id = string("engine_id");
    let addr = string("addr");
    let mut ints: Vec<Option<i64>> = Vec::new();
    for (key, required) in [
        ("dp_rank", true),
        ("tp_rank", true),
        ("pp_rank", true),
        ("tp_size", false),
        ("pp_size", false),
        ("dp_size", false),
    ] {
        ints.push(match obj.get(key) {
            None | Some(serde_json::Value::Null) if !required => None,
            None => {
                errors.push(field_error("missing", &[json!(key)], "Field required", &v));
                None
            }
            Some(x) => match lax_int(x) {
                Ok(i) => Some(i),
                Err((kind, msg)) => {
                    errors.push(field_error(kind, &[json!(key)], msg, x));
                    None
                }
            },
        });
    }
    if !errors.is_empty() {
        return Err((422, json!({ "detail": errors })));
    }
    let names = [
        "dp_rank", "tp_rank", "pp_rank", "tp_size", "pp_size", "dp_size",
    ];
    let mut vals = [None; 6];
    for (i, x) in ints.into_iter().enumerate() {
        vals[i] = match x {
            None => None,
            Some(n) => Some(u32::try_from(n).map_err(|_| {
                (
                    400,
                    json!({"detail": format!("{}={n} is out of range", names[i])}),
                )
            })?),
        };
    }
    Ok(RegisterRequest {
        engine_id,
        dp_rank: vals[0].unwrap_or(0),
        tp_rank: vals[1].unwrap_or(0),
        pp_rank: vals[2].unwrap_or(0),
        addr,
        tp_size: vals[3],
        pp_size: vals[4],
        dp_size: vals[5],
    })
}

fn token_ok(expected: &str, headers: &axum::http::HeaderMap) -> bool {
    let Some(got) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
    else {
        return false;
    };
    // Constant time in the token's content.
    got.len() == expected.len()
        && got
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Whether anything still accepts connections at a side-channel address.
async fn alive(addr: &str) -> bool {
    let Ok((host, port)) = parse_side_channel(addr) else {
        return false;
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    matches!(
        tokio::time::timeout(
            Duration::from_secs(1),
            tokio::net::TcpStream::connect((host.as_str(), port))
        )
        .await,
        Ok(Ok(_))
    )
}

async fn register_handler(
    State(state): State<Arc<ServerState>>,
    headers: axum::http::HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    if let Some(t) = &state.token {
        if !token_ok(t, &headers) {
            tracing::warn!(target: "mooncake_connector::bootstrap", "registration without the shared token refused");
            return detail(
                StatusCode::UNAUTHORIZED,
                format!("registration requires the shared token ({TOKEN_ENV})"),
            );
        }
    }
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            return detail(
                e.status(),
                format!("request body refused: {}", e.body_text()),
            )
        }
    };
    let req = match parse_register(&body) {
        Ok(r) => r,
        Err((code, answer)) => {
            let code = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST);
            return (code, Json(answer)).into_response();
        }
    };
    let result = async {
        validate(&req, state.expected)?;
        // A restarted worker is recognised as itself by its slot (same
        // engine id, dp/tp/pp ranks and sizes) *and* by the old address
        // being dead: only then may a new address replace the old one.
        let replacing = match state.check(&req)? {
            Outcome::Same => return Ok(false),
            Outcome::New => None,
            Outcome::Replace(old) => {
                if alive(&old).await {
                    return Err(conflict(format!(
                        "dp_rank {} tp_rank {} pp_rank {} is registered at {old}, which is still alive; \
                         not replacing it with {}",
                        req.dp_rank, req.tp_rank, req.pp_rank, req.addr
                    )));
                }
                Some(old)
            }
        };
        state.commit(&req, replacing.as_deref())?;
        Ok::<bool, Refusal>(true)
    }
    .await;
    match result {
        Ok(new) => {
            if new {
                tracing::info!(target: "mooncake_connector::bootstrap", engine_id = %req.engine_id,
                    dp = req.dp_rank, tp = req.tp_rank, pp = req.pp_rank, addr = %req.addr, "worker registered");
            }
            (StatusCode::OK, Json(json!({"status": "ok"}))).into_response()
        }
        Err((code, why)) => {
            tracing::warn!(target: "mooncake_connector::bootstrap", "registration refused: {why}");
            detail(code, why)
        }
    }
}

async fn method_not_allowed() -> Response {
    let mut r = detail(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    r.headers_mut().insert(
        axum::http::header::ALLOW,
        axum::http::HeaderValue::from_static("POST"),
    );
    r
}

async fn method_not_allowed_get() -> Response {
    let mut r = detail(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    r.headers_mut().insert(
        axum::http::header::ALLOW,
        axum::http::HeaderValue::from_static("GET"),
    );
    r
}

async fn not_found() -> Response {
    detail(StatusCode::NOT_FOUND, "Not Found")
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
    /// The registration token comes from `MOONCAKE_BOOTSTRAP_TOKEN` (off
    /// when unset or empty).
    pub async fn start(
        bind: SocketAddr,
        expected: Option<ExpectedTopology>,
    ) -> Result<Self, ConnectorError> {
        let token = std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty());
        Self::start_with_token(bind, expected, token).await
    }

    /// As [`start`](Self::start), with an explicit registration token
    /// (`None`: registration is open).
    pub async fn start_with_token(
        bind: SocketAddr,
        expected: Option<ExpectedTopology>,
        token: Option<String>,
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
            token,
        });
        let app = Router::new()
            .route(
                "/register",
                post(register_handler).fallback(method_not_allowed),
            )
            .route(
                "/query",
                get(query_handler).fallback(method_not_allowed_get),
            )
            .fallback(not_found)
            .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
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
    token: Option<String>,
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
            token: std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()),
        }
    }

    /// Sends `token` as `Authorization: Bearer` on `/register` (default:
    /// `MOONCAKE_BOOTSTRAP_TOKEN`, if set).
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
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
            let mut call = self.http.post(&url).timeout(self.timeout).json(req);
            if let Some(t) = &self.token {
                call = call.bearer_auth(t);
            }
            let resp = call.send().await.map_err(|e| classify(&url, e))?;
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
