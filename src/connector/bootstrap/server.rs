//! The bootstrap server's HTTP side: routes, the shared token, and the
//! running server's handle.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use std::sync::Mutex;

use super::table::{Outcome, ServerState, Table};
use super::validate::{conflict, parse_register, parse_side_channel, validate, Refusal};
use super::{ExpectedTopology, QueryTable, MAX_BODY, TOKEN_ENV};
use crate::connector::config::bootstrap_token_from_env;
use crate::connector::error::{ConnectorError, ConnectorErrorCode};

fn detail(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(json!({ "detail": msg.into() }))).into_response()
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
        Self::start_with_token(bind, expected, bootstrap_token_from_env()).await
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
