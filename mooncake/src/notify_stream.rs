//! Notifications as a stream, woken by the engine's reactor when one
//! arrives (no polling).
use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::error::Result;
use crate::notify::Notification;
use crate::shared::EngineShared;

/// The notifications peers send to an engine, in arrival order, made by
/// [`Engine::notification_stream`](crate::Engine::notification_stream).
///
/// It drains the engine's queue as
/// [`Engine::notifications`](crate::Engine::notifications) does, so one
/// consumer per engine: two streams (or a stream and that call) split the
/// messages between them. Implements `futures_core::Stream`; without a
/// stream library, [`recv`](Self::recv) awaits the next one.
///
/// ```
/// use mooncake::Engine;
///
/// # fn main() -> mooncake::Result<()> {
/// let decode = Engine::builder().local_host("127.0.0.1").build()?;
/// let prefill = Engine::builder().local_host("127.0.0.1").build()?;
/// let mut incoming = decode.notification_stream()?;
///
/// prefill.open_segment(decode.segment_name())?.notify("req-7", "kv ready")?;
/// let n = futures::executor::block_on(incoming.recv())?;
/// assert_eq!((n.name.as_str(), n.message.as_str()), ("req-7", "kv ready"));
/// # Ok(())
/// # }
/// ```
pub struct NotificationStream {
    engine: Arc<EngineShared>,
    ready: VecDeque<Notification>,
}

impl std::fmt::Debug for NotificationStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotificationStream")
            .field("ready", &self.ready.len())
            .finish()
    }
}

impl NotificationStream {
    pub(crate) fn new(engine: Arc<EngineShared>) -> Result<Self> {
        engine.reactor()?;
        Ok(Self {
            engine,
            ready: VecDeque::new(),
        })
    }

    /// The next notification.
    pub async fn recv(&mut self) -> Result<Notification> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Result<Notification>> {
        if let Some(n) = self.ready.pop_front() {
            return Poll::Ready(Ok(n));
        }
        let reactor = match self
            .engine
            .reactor()
            .and_then(|r| r.check_alive().map(|()| r))
        {
            Ok(r) => r,
            Err(e) => return Poll::Ready(Err(e)),
        };
        // Watch first, then drain: one that arrives in between is drained,
        // one that arrives after it wakes the watch.
        reactor.watch_notifications(cx.waker());
        match self.engine.raw.drain_notifications() {
            Ok(v) => {
                self.ready.extend(v);
                match self.ready.pop_front() {
                    Some(n) => Poll::Ready(Ok(n)),
                    None => Poll::Pending,
                }
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl futures_core::Stream for NotificationStream {
    type Item = Result<Notification>;

    /// Never ends: an engine can always receive another notification.
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_recv(cx).map(Some)
    }
}
