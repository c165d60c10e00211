//! Connector errors, each with a stable code and the detail that names the
//! cause.
use std::fmt;

/// Stable error categories of the connector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConnectorErrorCode {
    /// A configuration value or environment variable is invalid.
    Config,
    /// The bootstrap server refused or could not be reached.
    Bootstrap,
    /// The side channel (ZMQ) failed or timed out.
    SideChannel,
    /// A peer sent a message we cannot decode.
    Protocol,
    /// The two sides' KV layouts do not match.
    Layout,
    /// A KV transfer failed.
    Transfer,
    /// Timed out waiting for the other side.
    Timeout,
    /// The transfer engine reported an error.
    Engine,
}

impl fmt::Display for ConnectorErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::Config => "config",
            Self::Bootstrap => "bootstrap",
            Self::SideChannel => "side-channel",
            Self::Protocol => "protocol",
            Self::Layout => "layout",
            Self::Transfer => "transfer",
            Self::Timeout => "timeout",
            Self::Engine => "engine",
        };
        f.write_str(s)
    }
}

/// A connector error.
#[derive(Debug, thiserror::Error)]
#[error("{code}: {detail}")]
pub struct ConnectorError {
    /// The category.
    pub code: ConnectorErrorCode,
    /// What happened, naming the key, peer or request involved.
    pub detail: String,
}

impl ConnectorError {
    /// An error of category `code`.
    pub fn new(code: ConnectorErrorCode, detail: impl Into<String>) -> Self {
        Self {
            code,
            detail: detail.into(),
        }
    }

    /// A configuration error for `key`.
    pub fn config(key: &str, why: impl fmt::Display) -> Self {
        Self::new(ConnectorErrorCode::Config, format!("{key}: {why}"))
    }
}

impl From<mooncake::Error> for ConnectorError {
    fn from(e: mooncake::Error) -> Self {
        Self::new(ConnectorErrorCode::Engine, e.to_string())
    }
}
