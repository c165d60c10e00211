//! The prefill side: a ZMQ ROUTER that answers decoders' pull messages by
//! writing KV blocks into the decoders' registered memory.
//!
//! Send slots are keyed by `transfer_id`. A decoder may ask before the
//! prefill finished (the slot is then a placeholder); the pull waits for the
//! slot to become ready, bounded by `VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT`,
//! the clock restarting each time a request of the message completes. Ready
//! slots that no decoder claims within the abort timeout are freed by the
//! sweep. A slot is finished once every paired decoder rank has pulled it
//! (`need_send`).

mod pull;
mod slots;
mod vet;
mod write;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use mooncake::RemoteSegment;
use tokio::sync::{mpsc, Notify, Semaphore};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use super::error::{ConnectorError, ConnectorErrorCode};
use super::protocol::{encode, GroupBlocks, XferResponse};
use super::stats::ConnectorStats;
use super::worker::WorkerContext;
use super::zmtp_guard::{serve_front, Limits};
use pull::handle_message;
use slots::{SendSlot, SlotState};

pub use vet::{vet_pull, vet_stage_pull, MessagePlan};

/// What the producer tells its engine about requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProducerEvent {
    /// Every paired decoder pulled the request: its blocks can be freed.
    FinishedSending {
        /// The prefill request id.
        p_req_id: String,
        /// The shared transfer id.
        transfer_id: String,
    },
    /// No decoder pulled it within the abort timeout: its blocks can be freed.
    Expired {
        /// The prefill request id.
        p_req_id: String,
        /// The shared transfer id.
        transfer_id: String,
    },
}

/// Most pulls a worker serves at once (waiting ones included); more get an
/// error reply at once.
pub const MAX_PULLS_IN_FLIGHT: usize = 1024;
/// Most send slots a worker keeps (placeholders included).
pub const MAX_SLOTS: usize = 65536;

/// Counts a pull in flight while alive.
struct InFlight(Arc<std::sync::atomic::AtomicUsize>);

impl InFlight {
    fn take(c: &Arc<std::sync::atomic::AtomicUsize>) -> Option<Self> {
        use std::sync::atomic::Ordering;
        let prev = c.fetch_add(1, Ordering::AcqRel);
        if prev >= MAX_PULLS_IN_FLIGHT {
            c.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Self(c.clone()))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

struct Inner {
    ctx: Arc<WorkerContext>,
    slots: Mutex<HashMap<String, SendSlot>>,
    changed: Notify,
    events: mpsc::UnboundedSender<ProducerEvent>,
    writers: Arc<Semaphore>,
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    sessions: Mutex<HashMap<String, RemoteSegment>>,
    // One open in flight per decoder session: the first pulls of a burst
    // wait for it instead of each running a handshake (and a thread).
    opening: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    stats: Arc<ConnectorStats>,
}

/// A running producer for one TP rank.
pub struct Producer {
    inner: Arc<Inner>,
    addr: String,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Producer {
    /// Binds the ROUTER socket on `VLLM_HOST_IP` (random port) and starts
    /// serving pulls. Events about finished or expired requests go to
    /// `events`.
    pub async fn start(
        ctx: Arc<WorkerContext>,
        events: mpsc::UnboundedSender<ProducerEvent>,
    ) -> Result<Self, ConnectorError> {
        // The ROUTER listens on loopback only; peers reach it through the
        // bounded relay on the public address (see `zmtp_guard`).
        let mut socket = zeromq::RouterSocket::new();
        let private = socket.bind("tcp://127.0.0.1:0").await.map_err(|e| {
            ConnectorError::new(
                ConnectorErrorCode::SideChannel,
                format!("cannot bind the side channel's loopback socket: {e}"),
            )
        })?;
        let backend: std::net::SocketAddr = private
            .to_string()
            .trim_start_matches("tcp://")
            .parse()
            .map_err(|e| {
                ConnectorError::new(
                    ConnectorErrorCode::SideChannel,
                    format!("side channel bound at {private}: {e}"),
                )
            })?;
        let host = &ctx.env.host_ip;
        let ep = if host.contains(':') {
            format!("[{host}]:0")
        } else {
            format!("{host}:0")
        };
        let listener = tokio::net::TcpListener::bind(&ep).await.map_err(|e| {
            ConnectorError::new(
                ConnectorErrorCode::SideChannel,
                format!("cannot bind the side channel at {ep}: {e}"),
            )
        })?;
        let public = listener.local_addr().map_err(|e| {
            ConnectorError::new(
                ConnectorErrorCode::SideChannel,
                format!("side channel: {e}"),
            )
        })?;
        let addr = format!("tcp://{public}");
        let limits = Limits {
            max_message: ctx.env.side_channel_max_message,
            idle: ctx.env.receive_timeout(),
        };
        let front = tokio::spawn(serve_front(listener, backend, limits));
        let num_workers = ctx.config.num_workers;
        let inner = Arc::new(Inner {
            stats: ctx.stats.clone(),
            ctx,
            slots: Mutex::new(HashMap::new()),
            changed: Notify::new(),
            events,
            writers: Arc::new(Semaphore::new(num_workers)),
            in_flight: Default::default(),
            sessions: Mutex::new(HashMap::new()),
            opening: Mutex::new(HashMap::new()),
        });
        let serve = spawn_receiver(inner.clone(), socket);
        let sweep = spawn_sweep(inner.clone());
        tracing::info!(target: "mooncake_connector::producer", addr = %addr,
            tp_rank = inner.ctx.layout.tp_rank, "side channel listening");
        Ok(Self {
            inner,
            addr,
            tasks: vec![front, serve, sweep],
        })
    }

    /// The side-channel endpoint, `tcp://ip:port` (what is registered with
    /// the bootstrap server).
    pub fn side_channel_addr(&self) -> &str {
        &self.addr
    }

    /// The engine admitted a prefill request for `transfer_id` (before its
    /// KV exists): a decoder asking for it now waits for it, up to the
    /// abort timeout, instead of the short wait for unknown ids.
    pub fn request_started(&self, transfer_id: &str) {
        {
            let mut slots = self.inner.slots.lock().unwrap();
            let slot = slots
                .entry(transfer_id.to_string())
                .or_insert_with(SendSlot::placeholder);
            slot.expected = true;
            if let SlotState::Placeholder { since } = &mut slot.state {
                *since = Instant::now();
            }
        }
        self.inner.changed.notify_waiters();
    }

    /// Prefill of `p_req_id` finished (length-capped): its KV is in `blocks`
    /// and may be sent to decoders asking for `transfer_id`.
    pub fn request_ready(&self, transfer_id: &str, p_req_id: &str, blocks: GroupBlocks) {
        let expire_at = Instant::now() + self.inner.ctx.env.abort_request_timeout;
        let mut finished = None;
        {
            let mut slots = self.inner.slots.lock().unwrap();
            let slot = slots
                .entry(transfer_id.to_string())
                .or_insert_with(SendSlot::placeholder);
            slot.state = SlotState::Ready {
                p_req_id: p_req_id.to_string(),
                blocks,
                expire_at,
            };
            slot.expected = true;
            // Every paired decoder already released it (empty pulls).
            if slot.need_send.is_some_and(|n| slot.sent >= n) {
                slots.remove(transfer_id);
                finished = Some(p_req_id.to_string());
            }
        }
        if let Some(p) = finished {
            let _ = self.inner.events.send(ProducerEvent::FinishedSending {
                p_req_id: p,
                transfer_id: transfer_id.into(),
            });
        }
        self.inner.changed.notify_waiters();
    }

    /// The prefill request was aborted (or failed): nothing will be sent
    /// for `transfer_id`; decoders asking for it get an error at once.
    pub fn request_aborted(&self, transfer_id: &str) {
        let until = Instant::now() + self.inner.ctx.env.abort_request_timeout;
        self.inner.slots.lock().unwrap().insert(
            transfer_id.to_string(),
            SendSlot {
                state: SlotState::Aborted { until },
                need_send: None,
                sent: 0,
                sending: 0,
                expected: true,
                released_by: Vec::new(),
            },
        );
        self.inner.changed.notify_waiters();
    }

    /// Runs the expiry sweep now (it also runs periodically).
    pub fn sweep(&self) {
        self.inner.sweep();
    }

    /// Number of send slots held.
    pub fn slots(&self) -> usize {
        self.inner.slots.lock().unwrap().len()
    }

    /// Stops serving.
    pub fn stop(self) {}
}

impl Drop for Producer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Receives pull messages and serves each on its own task, refusing
/// them once `MAX_PULLS_IN_FLIGHT` are in flight.
fn spawn_receiver(inner: Arc<Inner>, socket: zeromq::RouterSocket) -> tokio::task::JoinHandle<()> {
    let (tx, mut rx) = socket.split();
    tokio::spawn(async move {
        loop {
            let msg = match rx.recv().await {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!(target: "mooncake_connector::producer", "side channel closed: {e}");
                    break;
                }
            };
            let frames: Vec<Bytes> = msg.into_vec();
            if frames.len() != 2 {
                tracing::warn!(target: "mooncake_connector::producer",
                    "dropping a side-channel message with {} frames (expected identity + payload)", frames.len());
                continue;
            }
            // A pull waiting for its prefill holds no handler slot:
            // only the writes are bounded (by `num_workers`), and
            // the number of pulls in flight is capped.
            let (inner, mut tx) = (inner.clone(), tx.clone());
            let Some(ticket) = InFlight::take(&inner.in_flight) else {
                tracing::warn!(target: "mooncake_connector::producer",
                    "refusing a pull: {MAX_PULLS_IN_FLIGHT} pulls in flight");
                let mut msg = ZmqMessage::from(frames[0].clone());
                msg.push_back(Bytes::from(encode(&XferResponse::error(format!(
                    "prefill worker busy: {MAX_PULLS_IN_FLIGHT} pulls in flight"
                )))));
                let _ = tx.send(msg).await;
                continue;
            };
            tokio::spawn(async move {
                let _ticket = ticket;
                handle_message(inner, frames[0].clone(), frames[1].clone(), tx).await;
            });
        }
    })
}

/// Runs the expiry sweep every eighth of the abort timeout (50 ms to 5 s).
fn spawn_sweep(inner: Arc<Inner>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let period = (inner.ctx.env.abort_request_timeout / 8)
            .clamp(Duration::from_millis(50), Duration::from_secs(5));
        loop {
            tokio::time::sleep(period).await;
            inner.sweep();
        }
    })
}
