//! Notifications: short messages peers send over the handshake port.

/// A notification received from a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The sender's chosen name (often its segment or request id).
    pub name: String,
    /// The message.
    pub message: String,
}
