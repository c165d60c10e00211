//! What a generation request carries and what it returns: vLLM's
//! `kv_transfer_params`, the output, and errors mapped to HTTP statuses.
use serde::Deserialize;

use crate::connector::{ConnectorError, ConnectorErrorCode};

/// `kv_transfer_params` of a request (vLLM's keys).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct KvTransferParams {
    /// Prefill leg: send the KV to a decoder.
    pub do_remote_decode: bool,
    /// Decode leg: pull the KV from a prefiller.
    pub do_remote_prefill: bool,
    /// The id shared by both legs.
    pub transfer_id: Option<String>,
    /// Decode leg: the prefill engine id.
    pub remote_engine_id: Option<String>,
    /// Decode leg: the prefiller's bootstrap server URL.
    pub remote_bootstrap_addr: Option<String>,
}

/// `stream_options` of a streamed request, read as vLLM reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamOptions {
    /// After the last chunk, one more with empty `choices` and the
    /// request's `usage`. vLLM's default once `stream_options` is given.
    pub include_usage: bool,
    /// `usage` so far on every chunk too (only with `include_usage`).
    pub continuous_usage_stats: bool,
}

impl StreamOptions {
    /// Reads `stream_options` from a request body whose `stream` is
    /// `stream`. As vLLM: absent or null is no usage; an object means
    /// `include_usage` unless it says `false` or `null`; a non-empty object
    /// on a request that does not stream is refused.
    pub fn from_body(body: &serde_json::Value, stream: bool) -> Result<Self, GenerateError> {
        use serde_json::Value;
        let o = match body.get("stream_options") {
            None | Some(Value::Null) => return Ok(Self::default()),
            Some(Value::Object(o)) => o,
            Some(_) => {
                return Err(GenerateError::bad_request(
                    "stream_options must be an object",
                ))
            }
        };
        if !o.is_empty() && !stream {
            return Err(GenerateError::bad_request(
                "Stream options can only be defined when `stream=True`.",
            ));
        }
        let flag = |key: &str, default: bool| match o.get(key) {
            None => Ok(default),
            Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(GenerateError::bad_request(format!(
                "stream_options.{key} must be a boolean or null"
            ))),
        };
        let include_usage = flag("include_usage", true)?;
        let continuous = flag("continuous_usage_stats", false)?;
        Ok(Self {
            include_usage,
            continuous_usage_stats: include_usage && continuous,
        })
    }
}

/// One generation request.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Request id (X-Request-Id or generated).
    pub request_id: String,
    /// Prompt text.
    pub prompt: String,
    /// Tokens to generate.
    pub max_tokens: usize,
    /// `kv_transfer_params`, if any.
    pub kv: Option<KvTransferParams>,
}

/// Where the KV a response was decoded from came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvSource {
    /// Computed here (prefill, or no transfer requested).
    Local,
    /// Received from a prefiller and verified.
    Remote,
    /// The transfer failed and the policy said recompute.
    Recomputed,
}

/// A finished generation.
#[derive(Debug, Clone)]
pub struct GenerateOutput {
    /// Generated text.
    pub text: String,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// OpenAI finish reason.
    pub finish_reason: &'static str,
    /// KV origin.
    pub kv_source: KvSource,
}

/// A failed generation, mapped to an HTTP status.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct GenerateError {
    /// HTTP status code.
    pub status: u16,
    /// OpenAI error type.
    pub kind: &'static str,
    /// What went wrong.
    pub message: String,
}

impl GenerateError {
    pub(super) fn bad_request(m: impl Into<String>) -> Self {
        Self {
            status: 400,
            kind: "invalid_request_error",
            message: m.into(),
        }
    }
    pub(super) fn kv(m: impl Into<String>) -> Self {
        Self {
            status: 500,
            kind: "kv_transfer_error",
            message: m.into(),
        }
    }
}

impl From<ConnectorError> for GenerateError {
    fn from(e: ConnectorError) -> Self {
        let status = if e.code == ConnectorErrorCode::Config {
            400
        } else {
            500
        };
        Self {
            status,
            kind: "connector_error",
            message: e.to_string(),
        }
    }
}
