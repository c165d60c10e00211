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
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use mooncake::{Error as EngineError, LocalMemory, RemoteSegment, TaskStatus};
use tokio::sync::{mpsc, Notify, Semaphore};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use super::error::{ConnectorError, ConnectorErrorCode};
use super::protocol::{
    decode, encode, GroupBlocks, PullBounds, XferMetadata, XferResponse, XferStatus,
};
use super::regions::{
    align_regions, check_tp_sizes, request_descriptors, select_blocks, sender_plan, target_ranks,
    CopyPlan, Descriptor, KvLayout,
};
use super::stats::ConnectorStats;
use super::worker::WorkerContext;
use super::zmtp_guard::{serve_front, Limits};

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

#[derive(Debug)]
enum SlotState {
    /// A decoder asked before the prefill finished.
    Placeholder { since: Instant },
    /// Prefill done; blocks known.
    Ready {
        p_req_id: String,
        blocks: GroupBlocks,
        expire_at: Instant,
    },
    /// The prefill request was aborted; answer pulls with an error until
    /// `until`.
    Aborted { until: Instant },
}

#[derive(Debug)]
struct SendSlot {
    state: SlotState,
    need_send: Option<usize>,
    sent: usize,
    sending: usize,
    /// The engine announced this transfer (or finished it): a pull may
    /// wait for it up to the abort timeout. A pull for a transfer nobody
    /// announced waits only `unknown_transfer_wait`.
    expected: bool,
    /// Decoder ranks (`host:port#rank`) that released this transfer: a pull
    /// of theirs still waiting for it ends without writing, so the decoder
    /// may free its blocks at once.
    released_by: Vec<String>,
}

impl SendSlot {
    /// A slot known only by its transfer id: the decoder asked (or the
    /// prefill finished) before the other side showed up.
    fn placeholder() -> Self {
        SendSlot {
            state: SlotState::Placeholder {
                since: Instant::now(),
            },
            need_send: None,
            sent: 0,
            sending: 0,
            expected: false,
            released_by: Vec::new(),
        }
    }
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
        });
        let (tx, mut rx) = socket.split();
        let serve = {
            let inner = inner.clone();
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
        };
        let sweep = {
            let inner = inner.clone();
            tokio::spawn(async move {
                let period = (inner.ctx.env.abort_request_timeout / 8)
                    .clamp(Duration::from_millis(50), Duration::from_secs(5));
                loop {
                    tokio::time::sleep(period).await;
                    inner.sweep();
                }
            })
        };
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

impl Inner {
    fn sweep(&self) {
        let now = Instant::now();
        let abort = self.ctx.env.abort_request_timeout;
        let mut expired = Vec::new();
        {
            let mut slots = self.slots.lock().unwrap();
            slots.retain(|tid, s| match &s.state {
                SlotState::Ready {
                    p_req_id,
                    expire_at,
                    ..
                } if s.sending == 0 && now >= *expire_at => {
                    expired.push((p_req_id.clone(), tid.clone()));
                    false
                }
                SlotState::Aborted { until } => now < *until,
                // A placeholder nobody completes (the prefill leg never
                // arrived) goes once no pull can still be waiting on it.
                SlotState::Placeholder { since } => now.duration_since(*since) < abort * 2,
                _ => true,
            });
        }
        for (p_req_id, transfer_id) in expired {
            tracing::warn!(target: "mooncake_connector::producer",
                "request {p_req_id} (transfer {transfer_id}) timed out after {} seconds without being sent. \
                 Freeing its blocks on the producer side.", abort.as_secs_f64());
            ConnectorStats::add(&self.stats.expired_slots, 1);
            let _ = self.events.send(ProducerEvent::Expired {
                p_req_id,
                transfer_id,
            });
        }
    }

    /// Counts one successful send (or release) of `transfer_id`; finishes
    /// the slot when every paired decoder rank has it.
    fn count_sent(&self, transfer_id: &str, was_sending: bool) {
        let mut done = None;
        {
            let mut slots = self.slots.lock().unwrap();
            if let Some(s) = slots.get_mut(transfer_id) {
                if was_sending {
                    s.sending -= 1;
                }
                s.sent += 1;
                if let (SlotState::Ready { p_req_id, .. }, Some(n)) = (&s.state, s.need_send) {
                    if s.sent >= n && s.sending == 0 {
                        done = Some(p_req_id.clone());
                    }
                }
                if done.is_some() {
                    slots.remove(transfer_id);
                }
            }
        }
        if let Some(p_req_id) = done {
            let _ = self.events.send(ProducerEvent::FinishedSending {
                p_req_id,
                transfer_id: transfer_id.into(),
            });
        }
    }

    fn end_sending_failed(&self, transfer_id: &str) {
        if let Some(s) = self.slots.lock().unwrap().get_mut(transfer_id) {
            s.sending = s.sending.saturating_sub(1);
        }
    }
}

struct Reply {
    identity: Bytes,
    tx: zeromq::RouterSendHalf,
}

impl Reply {
    async fn send(&mut self, r: &XferResponse) {
        let mut msg = ZmqMessage::from(self.identity.clone());
        msg.push_back(Bytes::from(encode(r)));
        if let Err(e) = self.tx.send(msg).await {
            tracing::warn!(target: "mooncake_connector::producer", "cannot reply to a decoder: {e}");
        }
    }
}

/// A request of a pull message waiting for its slot.
struct Pending {
    d_req_id: String,
    transfer_id: String,
    d_blocks: GroupBlocks,
}

/// A request whose slot is ready and marked sending.
struct ReadyReq {
    d_req_id: String,
    transfer_id: String,
    p_req_id: String,
    p_blocks: GroupBlocks,
    d_blocks: GroupBlocks,
}

async fn handle_message(
    inner: Arc<Inner>,
    identity: Bytes,
    payload: Bytes,
    tx: zeromq::RouterSendHalf,
) {
    let mut reply = Reply { identity, tx };
    match vet_pull(&inner.ctx.layout, inner.ctx.spec.num_blocks, &payload) {
        Ok((meta, plan)) => serve_pull(inner, meta, plan, reply).await,
        Err(e) => {
            tracing::warn!(target: "mooncake_connector::producer", "refusing a pull: {}", e.detail);
            reply.send(&XferResponse::error(e.detail)).await;
        }
    }
}

/// Decodes a pull message, validates every field against this worker's
/// layout (`num_blocks` per region) and plans it. Nothing here trusts a
/// peer value: an Err is the reply, naming the field or the mismatch.
pub fn vet_pull(
    layout: &KvLayout,
    num_blocks: u64,
    payload: &[u8],
) -> Result<(XferMetadata, MessagePlan), ConnectorError> {
    let meta: XferMetadata = decode("MooncakeXferMetadata", payload)?;
    let bounds = PullBounds {
        num_blocks,
        num_groups: layout.num_groups(),
    };
    meta.validate(&bounds)?;
    let plan = plan_message(layout, &meta).map_err(|e| {
        ConnectorError::new(
            e.code,
            format!(
                "refusing a pull from {}:{}: {}",
                meta.remote_hostname, meta.remote_port, e.detail
            ),
        )
    })?;
    Ok((meta, plan))
}

/// What one pull message needs, worked out before any slot is touched.
pub struct MessagePlan {
    /// The decoder's layout.
    pub d_layout: KvLayout,
    /// (producer region, consumer region) pairs.
    pub pairs: Vec<(usize, usize)>,
    /// The byte plan of each pair.
    pub plans: Vec<CopyPlan>,
    /// How many decoder ranks pull each request from this worker.
    pub need_send: usize,
}

fn plan_message(p: &KvLayout, meta: &XferMetadata) -> Result<MessagePlan, ConnectorError> {
    let d_tp = meta.remote_tp_size as usize;
    let d_rank = meta.remote_tp_rank as usize;
    check_tp_sizes(p.tp_size, d_tp.max(1))?;
    let d_layout = KvLayout::from_metadata(meta)?;
    let serves = target_ranks(p.tp_size, d_tp, p.tp_rank);
    if !serves.contains(&d_rank) {
        return Err(ConnectorError::new(
            ConnectorErrorCode::Layout,
            format!(
                "D tp_rank {d_rank} is not paired with P tp_rank {} (P serves D ranks {serves:?})",
                p.tp_rank
            ),
        ));
    }
    if meta.remote_pp_size != 1 {
        return Err(ConnectorError::new(
            ConnectorErrorCode::Layout,
            format!(
                "decode PP size {} is not supported (only 1)",
                meta.remote_pp_size
            ),
        ));
    }
    let pairs = align_regions(&p.regions, &d_layout.regions)?;
    let plans = pairs
        .iter()
        .map(|&(i, j)| {
            sender_plan(
                &p.regions[i],
                &d_layout.regions[j],
                p.tp_size,
                p.tp_rank,
                d_tp,
                d_rank,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(MessagePlan {
        d_layout,
        pairs,
        plans,
        need_send: serves.len(),
    })
}

async fn serve_pull(inner: Arc<Inner>, meta: XferMetadata, plan: MessagePlan, mut reply: Reply) {
    let session = format!("{}:{}", meta.remote_hostname, meta.remote_port);
    let who = format!("{session}#{}", meta.remote_tp_rank);
    let mut pending = Vec::new();
    let mut released = Vec::new();
    let mut failed_first: Vec<(String, String)> = Vec::new();
    {
        let mut slots = inner.slots.lock().unwrap();
        for (d_req_id, (transfer_id, d_blocks)) in meta.req_blocks {
            if d_blocks.iter().all(|g| g.is_empty()) {
                // A release may come before the prefill: keep a placeholder
                // so the slot ends once it is ready (bounded in number).
                if slots.len() >= MAX_SLOTS && !slots.contains_key(&transfer_id) {
                    failed_first.push((
                        d_req_id,
                        format!("prefill worker holds {MAX_SLOTS} transfers; release refused"),
                    ));
                    continue;
                }
                let slot = slots
                    .entry(transfer_id.clone())
                    .or_insert_with(SendSlot::placeholder);
                slot.need_send.get_or_insert(plan.need_send);
                if slot.released_by.len() < 64 {
                    slot.released_by.push(who.clone());
                }
                released.push((d_req_id, transfer_id));
            } else {
                pending.push(Pending {
                    d_req_id,
                    transfer_id,
                    d_blocks,
                });
            }
        }
    }
    // Empty pulls: the decoder aborted these before scheduling them. Count
    // them as sent so the prefill blocks are freed.
    for (d_req_id, transfer_id) in &released {
        tracing::info!(target: "mooncake_connector::producer",
            "decoder released transfer {transfer_id} (request {d_req_id}) without pulling");
        ConnectorStats::add(&inner.stats.released_slots, 1);
        inner.count_sent(transfer_id, false);
    }
    if !released.is_empty() {
        // Wake a pull of this decoder still waiting for a released transfer.
        inner.changed.notify_waiters();
    }
    let mut ok_first: Vec<String> = released.into_iter().map(|(d, _)| d).collect();
    let abort = inner.ctx.env.abort_request_timeout;
    let started = tokio::time::Instant::now();
    let mut deadline = started + abort;
    // A transfer this worker has never heard of gets a short grace (the
    // decoder may simply be ahead of the prefill request), then an error.
    let unknown_deadline = started + inner.ctx.env.unknown_transfer_wait;
    if pending.is_empty() && failed_first.is_empty() {
        reply
            .send(&XferResponse {
                status: XferStatus::Finish,
                ok_reqs: Some(ok_first),
                err_reqs: None,
                err_msg: None,
            })
            .await;
        return;
    }
    loop {
        let notified = inner.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let mut ready = Vec::new();
        let mut failed: Vec<(String, String)> = std::mem::take(&mut failed_first);
        let now = tokio::time::Instant::now();
        let mut waiting_unknown = false;
        {
            let mut slots = inner.slots.lock().unwrap();
            pending.retain_mut(|p| match slots.get_mut(&p.transfer_id) {
                // The decoder gave this request up while we waited (it sent
                // a release): end without touching its blocks.
                Some(s) if s.released_by.contains(&who) => {
                    failed.push((
                        p.d_req_id.clone(),
                        format!("transfer {} was released by the decoder", p.transfer_id),
                    ));
                    false
                }
                Some(s) if s.expected || !matches!(s.state, SlotState::Placeholder { .. }) => match &s.state {
                    SlotState::Ready {
                        p_req_id, blocks, ..
                    } => {
                        s.need_send.get_or_insert(plan.need_send);
                        s.sending += 1;
                        ready.push(ReadyReq {
                            d_req_id: p.d_req_id.clone(),
                            transfer_id: p.transfer_id.clone(),
                            p_req_id: p_req_id.clone(),
                            p_blocks: blocks.clone(),
                            d_blocks: std::mem::take(&mut p.d_blocks),
                        });
                        false
                    }
                    SlotState::Aborted { .. } => {
                        failed.push((
                            p.d_req_id.clone(),
                            format!("prefill request for transfer {} was aborted", p.transfer_id),
                        ));
                        false
                    }
                    SlotState::Placeholder { .. } => {
                        s.need_send.get_or_insert(plan.need_send);
                        true
                    }
                },
                _ if now < unknown_deadline => {
                    waiting_unknown = true;
                    true
                }
                _ => {
                    failed.push((
                        p.d_req_id.clone(),
                        format!(
                            "transfer {} is unknown to this prefill worker (never started, or already sent, released or expired)",
                            p.transfer_id
                        ),
                    ));
                    false
                }
            });
        }
        if !ready.is_empty() || !failed.is_empty() {
            let (ok, mut errs) = if ready.is_empty() {
                (Vec::new(), Vec::new())
            } else {
                write_ready(&inner, &session, &plan, ready).await
            };
            errs.extend(failed);
            let status = if pending.is_empty() {
                XferStatus::Finish
            } else {
                XferStatus::Continue
            };
            let mut ok_reqs = std::mem::take(&mut ok_first);
            ok_reqs.extend(ok);
            let err_msg = (!errs.is_empty()).then(|| {
                errs.iter()
                    .map(|(_, m)| m.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            });
            let err_reqs = (!errs.is_empty()).then(|| errs.into_iter().map(|(d, _)| d).collect());
            reply
                .send(&XferResponse {
                    status,
                    ok_reqs: Some(ok_reqs),
                    err_reqs,
                    err_msg,
                })
                .await;
            if pending.is_empty() {
                return;
            }
            deadline = tokio::time::Instant::now() + abort;
            continue;
        }
        let wake = if waiting_unknown {
            deadline.min(unknown_deadline)
        } else {
            deadline
        };
        if tokio::time::timeout_at(wake, notified).await.is_err() && wake < deadline {
            // The grace for unknown ids ran out: fail them on the next pass.
            continue;
        }
        if tokio::time::Instant::now() >= deadline {
            let err_reqs: Vec<String> = pending.iter().map(|p| p.d_req_id.clone()).collect();
            tracing::warn!(target: "mooncake_connector::producer",
                "timeout waiting for P side ready: {err_reqs:?} from {session}");
            reply
                .send(&XferResponse {
                    status: XferStatus::Finish,
                    ok_reqs: (!ok_first.is_empty()).then_some(ok_first),
                    err_reqs: Some(err_reqs),
                    err_msg: Some("Timeout waiting for P side ready.".into()),
                })
                .await;
            return;
        }
    }
}

/// Writes the ready requests of one message into the decoder, in one batch
/// on the writer pool. Returns (ok d_req_ids, failed (d_req_id, why)).
async fn write_ready(
    inner: &Arc<Inner>,
    session: &str,
    plan: &MessagePlan,
    ready: Vec<ReadyReq>,
) -> (Vec<String>, Vec<(String, String)>) {
    let mut failed = Vec::new();
    let mut descs: Vec<Descriptor> = Vec::new();
    let mut spans: Vec<(ReadyReq, std::ops::Range<usize>)> = Vec::new();
    for r in ready {
        let start = descs.len();
        let res = select_blocks(&r.p_blocks, &r.d_blocks).and_then(|blocks| {
            request_descriptors(
                &inner.ctx.layout,
                &plan.d_layout,
                &plan.pairs,
                &plan.plans,
                &blocks,
                &mut descs,
            )
        });
        match res {
            Ok(()) => {
                let end = descs.len();
                spans.push((r, start..end));
            }
            Err(e) => {
                descs.truncate(start);
                inner.end_sending_failed(&r.transfer_id);
                ConnectorStats::add(&inner.stats.transfers_failed, 1);
                failed.push((r.d_req_id, e.detail));
            }
        }
    }
    if spans.is_empty() {
        return (Vec::new(), failed);
    }
    let permit = inner
        .writers
        .clone()
        .acquire_owned()
        .await
        .expect("semaphore open");
    let started = Instant::now();
    let descs = Arc::new(descs);
    let job = {
        let (inner, descs) = (inner.clone(), descs.clone());
        let session = session.to_string();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            run_batch(&inner, &session, &descs)
        })
    };
    let result = job
        .await
        .unwrap_or_else(|e| Err(format!("writer task panicked: {e}")));
    let elapsed = started.elapsed();
    let mut ok = Vec::new();
    for (r, span) in spans {
        let outcome = match &result {
            Ok(per_desc) => match span
                .clone()
                .find_map(|i| per_desc[i].as_ref().err().map(|e| (i, e)))
            {
                None => Ok(()),
                Some((i, e)) => Err(format!("descriptor {i} of the batch failed: {e}")),
            },
            Err(why) => Err(why.clone()),
        };
        match outcome {
            Ok(()) => {
                let n = span.len() as u64;
                let bytes: u64 = descs[span].iter().map(|d| d.len).sum();
                ConnectorStats::add(&inner.stats.transfers_ok, 1);
                ConnectorStats::add(&inner.stats.descriptors_sent, n);
                ConnectorStats::add(&inner.stats.bytes_sent, bytes);
                tracing::info!(target: "mooncake_connector::producer",
                    request = %r.p_req_id, transfer = %r.transfer_id, decoder = %session,
                    bytes, descriptors = n, ms = elapsed.as_secs_f64() * 1e3, "KV sent");
                inner.count_sent(&r.transfer_id, true);
                ok.push(r.d_req_id);
            }
            Err(why) => {
                tracing::warn!(target: "mooncake_connector::producer",
                    request = %r.p_req_id, transfer = %r.transfer_id, decoder = %session, "KV write failed: {why}");
                ConnectorStats::add(&inner.stats.transfers_failed, 1);
                inner.end_sending_failed(&r.transfer_id);
                failed.push((r.d_req_id, why));
            }
        }
    }
    (ok, failed)
}

/// One blocking batch WRITE of `descs` to the decoder's segment `session`:
/// per descriptor, Ok or the engine's reason.
fn run_batch(
    inner: &Inner,
    session: &str,
    descs: &[Descriptor],
) -> Result<Vec<Result<(), String>>, String> {
    let ctx = &inner.ctx;
    let seg = {
        let cached = inner.sessions.lock().unwrap().get(session).cloned();
        match cached {
            Some(s) => s,
            None => {
                let s = ctx
                    .engine
                    .open_segment(session)
                    .map_err(|e| format!("cannot open decoder segment {session}: {e}"))?;
                inner
                    .sessions
                    .lock()
                    .unwrap()
                    .insert(session.to_string(), s.clone());
                s
            }
        }
    };
    let kv = &*ctx.kv;
    let base = kv.addr();
    let mut batch = ctx.engine.batch(descs.len()).map_err(|e| e.to_string())?;
    for d in descs {
        let off = d
            .src
            .checked_sub(base)
            .filter(|o| o + d.len <= kv.len() as u64)
            .ok_or_else(|| {
                format!(
                    "descriptor source {:#x}+{} is outside this worker's KV cache",
                    d.src, d.len
                )
            })?;
        batch
            .write(kv, off as usize, &seg, d.dst, d.len as usize)
            .map_err(|e| e.to_string())?;
    }
    batch
        .submit()
        .map_err(|e| format!("Mooncake transfer engine refused the batch: {e}"))?;
    match batch.wait(None) {
        Ok(()) | Err(EngineError::Transfer { .. }) => {}
        Err(e) => return Err(format!("Mooncake transfer engine returned {e}")),
    }
    // One pass over the statuses (the wait above already read them all).
    let statuses = batch.statuses().map_err(|e| e.to_string())?;
    let mut out: Vec<Result<(), String>> = vec![Ok(()); statuses.len()];
    let failed: Vec<(usize, TaskStatus)> = statuses
        .not_completed()
        .map(|i| (i, statuses.get(i).unwrap_or(TaskStatus::Unknown(-1))))
        .collect();
    for (i, st) in failed {
        out[i] = Err(batch
            .error_of(i)
            .ok()
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| format!("{st:?}")));
    }
    Ok(out)
}
