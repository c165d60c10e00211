//! Opening a remote segment from async code. The open is a handshake with
//! the peer (or a metadata-store lookup) through the engine's blocking C
//! API, bounded by the engine's handshake timeouts; it runs on a short-lived
//! thread of its own, so that no executor thread waits for the network.
//! Opens are rare next to transfers (a connector opens each peer once).
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::error::{Error, ErrorCode, Result};
use crate::segment::RemoteSegment;

#[derive(Default)]
struct Slot {
    result: Option<Result<RemoteSegment>>,
    waker: Option<Waker>,
}

/// The future of [`Engine::open_segment_async`](crate::Engine::open_segment_async).
/// Dropping it lets the open finish in the background; its segment is then
/// dropped.
#[must_use = "the open runs anyway; await this for the segment"]
pub struct OpenSegment {
    slot: Arc<Mutex<Slot>>,
}

impl std::fmt::Debug for OpenSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenSegment").finish_non_exhaustive()
    }
}

impl OpenSegment {
    /// Runs `open` on a new thread; the future resolves with its result.
    pub(crate) fn spawn(
        name: &str,
        open: impl FnOnce() -> Result<RemoteSegment> + Send + 'static,
    ) -> Result<Self> {
        let slot = Arc::new(Mutex::new(Slot::default()));
        let theirs = slot.clone();
        std::thread::Builder::new()
            .name("mooncake-open".into())
            .spawn(move || {
                let result = open();
                let waker = {
                    let mut s = theirs.lock().unwrap_or_else(|e| e.into_inner());
                    s.result = Some(result);
                    s.waker.take()
                };
                if let Some(w) = waker {
                    w.wake();
                }
            })
            .map_err(|e| Error::Engine {
                code: ErrorCode::Internal,
                message: format!("cannot start a thread to open segment {name:?}: {e}"),
            })?;
        Ok(Self { slot })
    }
}

impl Future for OpenSegment {
    type Output = Result<RemoteSegment>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<RemoteSegment>> {
        let mut s = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        match s.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                let replaced = s.waker.replace(cx.waker().clone());
                drop(s);
                drop(replaced);
                Poll::Pending
            }
        }
    }
}
