//! Errors: every engine failure keeps its numeric code and the engine's
//! message, which names the cause.
use std::fmt;
use std::time::Duration;

/// What went wrong, as the engine's numeric code.
///
/// Negative engine codes (`ERR_*`, upstream's numbering) and positive
/// submit/status codes map onto the same variants; unknown values are kept
/// in [`ErrorCode::Unknown`].
///
/// ```
/// use mooncake::ErrorCode;
///
/// let code = ErrorCode::from_raw(-3);
/// assert_eq!(code, ErrorCode::AddressNotRegistered);
/// assert_eq!(ErrorCode::from_status(3), code); // the positive status form
/// assert_eq!(code.raw(), -3);
/// assert_eq!(code.to_string(), "ERR_ADDRESS_NOT_REGISTERED (-3)");
/// assert_eq!(ErrorCode::from_raw(-42), ErrorCode::Unknown(-42));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// `ERR_INVALID_ARGUMENT` (-1) / status 1.
    InvalidArgument,
    /// `ERR_TOO_MANY_REQUESTS` (-2) / status 2: a batch is full.
    TooManyRequests,
    /// `ERR_ADDRESS_NOT_REGISTERED` (-3) / status 3.
    AddressNotRegistered,
    /// `ERR_BATCH_BUSY` (-4) / status 4.
    BatchBusy,
    /// `ERR_DEVICE_NOT_FOUND` (-6).
    DeviceNotFound,
    /// `ERR_ADDRESS_OVERLAPPED` (-7): overlaps a registered buffer.
    AddressOverlapped,
    /// Status 8: the segment uses a transport this engine has not installed.
    NotSupportedTransport,
    /// `ERR_DNS` (-101): a host name did not resolve.
    Dns,
    /// `ERR_SOCKET` (-102): connect or I/O failure on a handshake socket.
    Socket,
    /// `ERR_MALFORMED_JSON` (-103): a peer sent bad JSON.
    MalformedJson,
    /// `ERR_REJECT_HANDSHAKE` (-104).
    RejectHandshake,
    /// `ERR_METADATA` (-200): bad or missing segment metadata.
    Metadata,
    /// `ERR_ENDPOINT` (-201).
    Endpoint,
    /// `ERR_CONTEXT` (-202).
    Context,
    /// `ERR_NUMA` (-300).
    Numa,
    /// `ERR_CLOCK` (-301).
    Clock,
    /// `ERR_MEMORY` (-302).
    Memory,
    /// `ERR_NOT_IMPLEMENTED` (-303) / status 999.
    NotImplemented,
    /// An engine wait timed out (extension code -1001).
    Timeout,
    /// The engine is shutting down (-1002).
    Shutdown,
    /// An output buffer was too small (-1003).
    BufferTooSmall,
    /// An internal engine error (-1004).
    Internal,
    /// A transfer ended FAILED (-1005).
    TransferFailed,
    /// A code this crate does not know.
    Unknown(i32),
}

impl ErrorCode {
    /// Decodes a negative engine code (`ERR_*`).
    pub fn from_raw(code: i32) -> Self {
        match code {
            -1 => Self::InvalidArgument,
            -2 => Self::TooManyRequests,
            -3 => Self::AddressNotRegistered,
            -4 => Self::BatchBusy,
            -6 => Self::DeviceNotFound,
            -7 => Self::AddressOverlapped,
            -101 => Self::Dns,
            -102 => Self::Socket,
            -103 => Self::MalformedJson,
            -104 => Self::RejectHandshake,
            -200 => Self::Metadata,
            -201 => Self::Endpoint,
            -202 => Self::Context,
            -300 => Self::Numa,
            -301 => Self::Clock,
            -302 => Self::Memory,
            -303 => Self::NotImplemented,
            -1001 => Self::Timeout,
            -1002 => Self::Shutdown,
            -1003 => Self::BufferTooSmall,
            -1004 => Self::Internal,
            -1005 => Self::TransferFailed,
            other => Self::Unknown(other),
        }
    }

    /// Decodes a positive status code (returned by submit and free calls).
    pub fn from_status(status: i32) -> Self {
        match status {
            8 => Self::NotSupportedTransport,
            999 => Self::NotImplemented,
            s if s > 0 => Self::from_raw(-s),
            s => Self::from_raw(s),
        }
    }

    /// The engine's negative code for this error (status 8 has none and is
    /// reported as -8).
    pub fn raw(self) -> i32 {
        match self {
            Self::InvalidArgument => -1,
            Self::TooManyRequests => -2,
            Self::AddressNotRegistered => -3,
            Self::BatchBusy => -4,
            Self::DeviceNotFound => -6,
            Self::AddressOverlapped => -7,
            Self::NotSupportedTransport => -8,
            Self::Dns => -101,
            Self::Socket => -102,
            Self::MalformedJson => -103,
            Self::RejectHandshake => -104,
            Self::Metadata => -200,
            Self::Endpoint => -201,
            Self::Context => -202,
            Self::Numa => -300,
            Self::Clock => -301,
            Self::Memory => -302,
            Self::NotImplemented => -303,
            Self::Timeout => -1001,
            Self::Shutdown => -1002,
            Self::BufferTooSmall => -1003,
            Self::Internal => -1004,
            Self::TransferFailed => -1005,
            Self::Unknown(c) => c,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotSupportedTransport => write!(f, "STATUS_NOT_SUPPORTED_TRANSPORT"),
            Self::Unknown(c) => write!(f, "unknown code {c}"),
            other => write!(f, "{} ({})", other.engine_name(), other.raw()),
        }
    }
}

impl ErrorCode {
    /// The engine's symbolic name for a known code (what `mc_error_name`
    /// returns; kept here so this bottom module needs no FFI call, and
    /// checked against the engine by a test in `ffi`).
    pub(crate) fn engine_name(self) -> &'static str {
        match self {
            Self::InvalidArgument => "ERR_INVALID_ARGUMENT",
            Self::TooManyRequests => "ERR_TOO_MANY_REQUESTS",
            Self::AddressNotRegistered => "ERR_ADDRESS_NOT_REGISTERED",
            Self::BatchBusy => "ERR_BATCH_BUSY",
            Self::DeviceNotFound => "ERR_DEVICE_NOT_FOUND",
            Self::AddressOverlapped => "ERR_ADDRESS_OVERLAPPED",
            Self::NotSupportedTransport => "STATUS_NOT_SUPPORTED_TRANSPORT",
            Self::Dns => "ERR_DNS",
            Self::Socket => "ERR_SOCKET",
            Self::MalformedJson => "ERR_MALFORMED_JSON",
            Self::RejectHandshake => "ERR_REJECT_HANDSHAKE",
            Self::Metadata => "ERR_METADATA",
            Self::Endpoint => "ERR_ENDPOINT",
            Self::Context => "ERR_CONTEXT",
            Self::Numa => "ERR_NUMA",
            Self::Clock => "ERR_CLOCK",
            Self::Memory => "ERR_MEMORY",
            Self::NotImplemented => "ERR_NOT_IMPLEMENTED",
            Self::Timeout => "MC_ERR_TIMEOUT",
            Self::Shutdown => "MC_ERR_SHUTDOWN",
            Self::BufferTooSmall => "MC_ERR_BUFFER_TOO_SMALL",
            Self::Internal => "MC_ERR_INTERNAL",
            Self::TransferFailed => "MC_ERR_TRANSFER_FAILED",
            Self::Unknown(_) => "UNKNOWN",
        }
    }
}

/// An error of this crate.
///
/// Every variant has an [`ErrorCode`] ([`code`](Self::code)), which is what
/// to match on to decide what to do:
///
/// ```
/// use mooncake::{Access, Engine, Error, ErrorCode, LocalMemory};
///
/// # fn main() -> mooncake::Result<()> {
/// let engine = Engine::builder().local_host("127.0.0.1").build()?;
/// let local = engine.register(vec![0u8; 64], "*", Access::LocalOnly)?;
/// let own = engine.local_segment();
/// let mut batch = engine.batch(1)?;
///
/// // Caller-side mistakes are refused before they reach the engine.
/// let err = batch.read(&local, 60, &own, local.addr(), 8).unwrap_err();
/// assert!(matches!(err, Error::InvalidArgument(_)));
///
/// batch.read(&local, 0, &own, local.addr(), 8)?;
/// let err = batch.read(&local, 8, &own, local.addr(), 8).unwrap_err();
/// match err.code() {
///     ErrorCode::TooManyRequests => {} // full: submit and wait, then reset
///     other => panic!("unexpected {other}: {err}"),
/// }
///
/// // Nobody listens on port 1: connecting fails.
/// let err = engine.open_segment("127.0.0.1:1").unwrap_err();
/// assert_eq!(err.code(), ErrorCode::Socket, "{err}");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An engine call failed; `message` is the engine's explanation.
    #[error("{message} [{code}]")]
    Engine {
        /// The engine's code.
        code: ErrorCode,
        /// The engine's message, naming the cause.
        message: String,
    },
    /// Some transfers of a batch ended FAILED.
    #[error("{failed} of {total} transfers failed; request {first_task}: {message}")]
    Transfer {
        /// How many requests failed.
        failed: usize,
        /// How many requests the batch held.
        total: usize,
        /// Index of the first failed request.
        first_task: usize,
        /// Why it failed.
        message: String,
    },
    /// A wait gave up; the batch is still in flight and still yours.
    #[error("batch still in flight after {0:?}; wait again or drop it (dropping waits for it)")]
    Timeout(Duration),
    /// A caller-side argument was rejected before reaching the engine.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The engine reported JSON this crate could not decode (a sign that the
    /// engine and this crate come from different versions).
    #[error("cannot decode the engine's {what}: {detail}")]
    Decode {
        /// What was being decoded, e.g. `"RDMA topology"`.
        what: &'static str,
        /// The decoder's message (position and field) and the start of the
        /// text.
        detail: String,
    },
}

impl Error {
    /// The numeric code behind this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Engine { code, .. } => *code,
            Self::Transfer { .. } => ErrorCode::TransferFailed,
            Self::Timeout(_) => ErrorCode::Timeout,
            Self::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Self::Decode { .. } => ErrorCode::MalformedJson,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
