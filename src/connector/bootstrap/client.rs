//! The bootstrap client: `/register` and `/query` with vLLM's retry
//! schedule.
//!
//! `/register` sends the newer body (vLLM's five fields plus `tp_size`,
//! `pp_size` and our `dp_size`). A server that answers it 422 (a strict or
//! older server refusing the fields it does not know) gets the five-field
//! body once more, and the client remembers that URL for later
//! registrations.
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{QueryTable, RegisterRequest};
use crate::connector::config::bootstrap_token_from_env;
use crate::connector::error::{ConnectorError, ConnectorErrorCode};

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
    /// Base URLs that refused the newer body with 422 and took the
    /// five-field one: later registrations there send the five fields at
    /// once. Shared by clones.
    five_field_servers: Arc<Mutex<HashSet<String>>>,
}

/// How a registration body ended once transport retries were done: the
/// server's status and body when it refused it.
type Answer = Result<(), (reqwest::StatusCode, String)>;

/// vLLM's original registration body: no `tp_size`, `pp_size` or `dp_size`.
fn five_fields(req: &RegisterRequest) -> RegisterRequest {
    RegisterRequest {
        tp_size: None,
        pp_size: None,
        dp_size: None,
        ..req.clone()
    }
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
            token: bootstrap_token_from_env(),
            five_field_servers: Arc::default(),
        }
    }

    /// Whether registrations at `base_url` send vLLM's five-field body
    /// (the server refused the newer one with 422 before).
    pub fn uses_five_field_body(&self, base_url: &str) -> bool {
        let key = base_url.trim_end_matches('/');
        self.five_field_servers
            .lock()
            .map(|s| s.contains(key))
            .unwrap_or(false)
    }

    fn remember_five_field(&self, base_url: &str) {
        if let Ok(mut s) = self.five_field_servers.lock() {
            // Bounded: one entry per bootstrap server this client talks to,
            // capped in case a caller walks through many.
            if s.len() < 1024 {
                s.insert(base_url.to_string());
            }
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
    ///
    /// The body carries `tp_size`/`pp_size`/`dp_size` when `req` has them
    /// (vLLM's newer server refuses a TP > 1 registration without
    /// `tp_size`). If the server answers that body with 422, as a strict
    /// older server does for fields it does not know, the registration is
    /// sent once more with the five fields `engine_id`, `dp_rank`,
    /// `tp_rank`, `pp_rank`, `addr`, and later registrations at the same
    /// URL (by this client or its clones) send those at once.
    pub async fn register(
        &self,
        base_url: &str,
        req: &RegisterRequest,
    ) -> Result<(), ConnectorError> {
        let base = base_url.trim_end_matches('/');
        let url = format!("{base}/register");
        let five = five_fields(req);
        let extended = five != *req;
        if extended && self.uses_five_field_body(base) {
            tracing::debug!(target: "mooncake_connector::bootstrap", %url,
                "registering with the five-field body (this server refused the newer one before)");
            return self
                .post_register(&url, &five)
                .await?
                .map_err(|(status, body)| refused(&url, status, &body));
        }
        match self.post_register(&url, req).await? {
            Ok(()) => Ok(()),
            Err((status, body)) if extended && status.as_u16() == 422 => {
                tracing::warn!(target: "mooncake_connector::bootstrap", %url, %status,
                    detail = %body,
                    "the bootstrap server refused the registration body with tp_size/pp_size/dp_size; \
                     retrying once with the five-field body of older servers");
                match self.post_register(&url, &five).await? {
                    Ok(()) => {
                        self.remember_five_field(base);
                        tracing::info!(target: "mooncake_connector::bootstrap", %url,
                            "registered with the five-field body; later registrations here use it");
                        Ok(())
                    }
                    Err((status2, body2)) => Err(ConnectorError::new(
                        ConnectorErrorCode::Bootstrap,
                        format!(
                            "POST {url} returned {status}: {body} (body with tp_size/pp_size/dp_size); \
                             then {status2}: {body2} (five-field body)"
                        ),
                    )),
                }
            }
            Err((status, body)) => Err(refused(&url, status, &body)),
        }
    }

    /// POSTs one registration body with the transport retries; an HTTP
    /// refusal comes back as `Ok(Err(..))`, not retried.
    async fn post_register(
        &self,
        url: &str,
        body: &RegisterRequest,
    ) -> Result<Answer, ConnectorError> {
        let what = format!("bootstrap registration at {url}");
        self.with_retries(&what, || async {
            let mut call = self.http.post(url).timeout(self.timeout).json(body);
            if let Some(t) = &self.token {
                call = call.bearer_auth(t);
            }
            let resp = call.send().await.map_err(|e| classify(url, e))?;
            let status = resp.status();
            if status.is_success() {
                return Ok(Ok(()));
            }
            let text = read_capped(resp, MAX_ERROR_BODY).await.unwrap_or_default();
            Ok(Err((status, truncate(text))))
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
                let body = read_capped(resp, MAX_ERROR_BODY).await.unwrap_or_default();
                return Err(CallError::Fatal(ConnectorError::new(
                    ConnectorErrorCode::Bootstrap,
                    format!("GET {url} returned {status}: {}", truncate(body)),
                )));
            }
            // The server is a peer: its answer is read up to a bound, then
            // parsed.
            let body = read_capped(resp, MAX_TABLE_BODY).await.map_err(|e| {
                CallError::Fatal(ConnectorError::new(
                    ConnectorErrorCode::Protocol,
                    format!("GET {url}: {e}"),
                ))
            })?;
            serde_json::from_str::<QueryTable>(&body).map_err(|e| {
                CallError::Fatal(ConnectorError::new(
                    ConnectorErrorCode::Protocol,
                    format!("GET {url}: the answer is not a bootstrap table: {e}"),
                ))
            })
        })
        .await
    }
}

/// An HTTP refusal of a registration as an error.
fn refused(url: &str, status: reqwest::StatusCode, body: &str) -> ConnectorError {
    ConnectorError::new(
        ConnectorErrorCode::Bootstrap,
        format!("POST {url} returned {status}: {body}"),
    )
}

/// A peer's error body, cut to what a log line and an error message need.
fn truncate(mut s: String) -> String {
    const MAX: usize = 1024;
    if s.len() > MAX {
        let mut end = MAX;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
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

/// Largest bootstrap table read from a server (a full table of 1,024 TP
/// ranks × 64 PP stages of one DP rank is about 3 MiB).
pub const MAX_TABLE_BODY: usize = 4 << 20;
/// Largest error body read from a server (only its start is shown).
const MAX_ERROR_BODY: usize = 64 << 10;

/// The body of `resp` as text, refused past `cap` bytes (counted as they
/// arrive, whatever Content-Length says).
async fn read_capped(mut resp: reqwest::Response, cap: usize) -> Result<String, String> {
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?
    {
        if body.len() + chunk.len() > cap {
            return Err(format!("the answer is larger than {cap} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body).map_err(|_| "the answer is not UTF-8".to_string())
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
