//! Notifications: short messages peers send over the handshake port.

/// A notification received from a peer.
///
/// A peer sends one with [`RemoteSegment::notify`](crate::RemoteSegment::notify)
/// (now) or [`Batch::submit_with_notify`](crate::Batch::submit_with_notify)
/// (once the batch's transfers completed); the receiver drains what arrived
/// with [`Engine::notifications`](crate::Engine::notifications):
///
/// ```
/// use mooncake::{Engine, Notification};
///
/// # fn main() -> mooncake::Result<()> {
/// let decode = Engine::builder().local_host("127.0.0.1").build()?;
/// let prefill = Engine::builder().local_host("127.0.0.1").build()?;
///
/// let peer = prefill.open_segment(decode.segment_name())?;
/// peer.notify("req-7", "layer 0 done")?;
/// peer.notify("req-7", "layer 1 done")?;
///
/// let got = decode.notifications()?;
/// assert_eq!(got.len(), 2);
/// assert_eq!(got[0], Notification { name: "req-7".into(), message: "layer 0 done".into() });
/// assert!(decode.notifications()?.is_empty()); // drained
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The sender's chosen name (often its segment or request id).
    pub name: String,
    /// The message.
    pub message: String,
}
