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
