//! The bootstrap client: `/register` and `/query` with vLLM's retry
//! schedule.
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
