//! Serving one pull message: sort its requests, wait for their slots,
//! write the ready ones and answer (`Continue` until the last, `Finish`).
use std::sync::Arc;

use bytes::Bytes;
use zeromq::{SocketSend, ZmqMessage};

use super::slots::{SendSlot, SlotState};
use super::vet::{vet_stage_pull, MessagePlan};
use super::write::write_ready;
use super::{Inner, MAX_SLOTS};
use crate::connector::protocol::{encode, GroupBlocks, XferMetadata, XferResponse, XferStatus};
use crate::connector::stats::ConnectorStats;

pub(super) struct Reply {
    pub(super) identity: Bytes,
    pub(super) tx: zeromq::RouterSendHalf,
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
pub(super) struct Pending {
    pub(super) d_req_id: String,
    pub(super) transfer_id: String,
    pub(super) d_blocks: GroupBlocks,
}

/// A request whose slot is ready and marked sending.
pub(super) struct ReadyReq {
    pub(super) d_req_id: String,
    pub(super) transfer_id: String,
    pub(super) p_req_id: String,
    pub(super) p_blocks: GroupBlocks,
    pub(super) d_blocks: GroupBlocks,
}

pub(super) async fn handle_message(
    inner: Arc<Inner>,
    identity: Bytes,
    payload: Bytes,
    tx: zeromq::RouterSendHalf,
) {
    let mut reply = Reply { identity, tx };
    match vet_stage_pull(
        &inner.ctx.layout,
        inner.ctx.spec.max_blocks(),
        inner.ctx.spec.groups,
        &inner.ctx.spec.other_stage_layers,
        &payload,
    ) {
        Ok((meta, plan)) => serve_pull(inner, meta, plan, reply).await,
        Err(e) => {
            tracing::warn!(target: "mooncake_connector::producer", "refusing a pull: {}", e.detail);
            reply.send(&XferResponse::error(e.detail)).await;
        }
    }
}

/// The requests of one message, sorted before any wait.
struct Sorted {
    /// Requests with blocks to fill, waiting for their slots.
    pending: Vec<Pending>,
    /// Empty pulls: (d_req_id, transfer_id) the decoder gave up.
    released: Vec<(String, String)>,
    /// Requests refused at once: (d_req_id, why).
    refused: Vec<(String, String)>,
}

/// What one pass over the pending requests found.
#[derive(Default)]
struct Pass {
    ready: Vec<ReadyReq>,
    failed: Vec<(String, String)>,
    /// Some request waits for a transfer nobody announced yet.
    waiting_unknown: bool,
}

/// Serves one vetted pull message to its end: releases first, then each
/// request as its slot becomes ready, bounded by the abort timeout (the
/// clock restarting after each answer).
pub(super) async fn serve_pull(
    inner: Arc<Inner>,
    meta: XferMetadata,
    plan: MessagePlan,
    mut reply: Reply,
) {
    let session = format!("{}:{}", meta.remote_hostname, meta.remote_port);
    let who = format!("{session}#{}", meta.remote_tp_rank);
    let Sorted {
        mut pending,
        released,
        refused,
    } = sort_requests(&inner, meta.req_blocks, &plan, &who);
    count_releases(&inner, &released);
    let mut ok_first: Vec<String> = released.into_iter().map(|(d, _)| d).collect();
    let mut failed_first = refused;
    let abort = inner.ctx.env.abort_request_timeout;
    let started = tokio::time::Instant::now();
    let mut deadline = started + abort;
    // A transfer this worker has never heard of gets a short grace (the
    // decoder may simply be ahead of the prefill request), then an error.
    let unknown_deadline = started + inner.ctx.env.unknown_transfer_wait;
    if pending.is_empty() && failed_first.is_empty() {
        reply.send(&finish_ok(ok_first)).await;
        return;
    }
    loop {
        let notified = inner.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let mut pass = claim_ready(&inner, &mut pending, &who, &plan, unknown_deadline);
        pass.failed.splice(0..0, std::mem::take(&mut failed_first));
        if !pass.ready.is_empty() || !pass.failed.is_empty() {
            let ok_reqs = std::mem::take(&mut ok_first);
            let done = pending.is_empty();
            let answer = answer_pass(&inner, &session, &plan, pass, ok_reqs, done).await;
            reply.send(&answer).await;
            if done {
                return;
            }
            deadline = tokio::time::Instant::now() + abort;
            continue;
        }
        let wake = if pass.waiting_unknown {
            deadline.min(unknown_deadline)
        } else {
            deadline
        };
        if tokio::time::timeout_at(wake, notified).await.is_err() && wake < deadline {
            // The grace for unknown ids ran out: fail them on the next pass.
            continue;
        }
        if tokio::time::Instant::now() >= deadline {
            reply.send(&timed_out(&pending, ok_first, &session)).await;
            return;
        }
    }
}

/// Splits a message's requests into releases (empty block lists), requests
/// to serve, and releases refused because the slot table is full.
fn sort_requests(
    inner: &Inner,
    req_blocks: impl IntoIterator<Item = (String, (String, GroupBlocks))>,
    plan: &MessagePlan,
    who: &str,
) -> Sorted {
    let mut sorted = Sorted {
        pending: Vec::new(),
        released: Vec::new(),
        refused: Vec::new(),
    };
    let mut slots = inner.slots.lock().unwrap();
    for (d_req_id, (transfer_id, d_blocks)) in req_blocks {
        if !d_blocks.iter().all(|g| g.is_empty()) {
            sorted.pending.push(Pending {
                d_req_id,
                transfer_id,
                d_blocks,
            });
            continue;
        }
        // A release may come before the prefill: keep a placeholder so the
        // slot ends once it is ready (bounded in number).
        if slots.len() >= MAX_SLOTS && !slots.contains_key(&transfer_id) {
            sorted.refused.push((
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
            slot.released_by.push(who.to_string());
        }
        sorted.released.push((d_req_id, transfer_id));
    }
    sorted
}

/// Empty pulls: the decoder aborted these before scheduling them. Counts
/// them as sent so the prefill blocks are freed.
fn count_releases(inner: &Inner, released: &[(String, String)]) {
    for (d_req_id, transfer_id) in released {
        tracing::info!(target: "mooncake_connector::producer",
            "decoder released transfer {transfer_id} (request {d_req_id}) without pulling");
        ConnectorStats::add(&inner.stats.released_slots, 1);
        inner.count_sent(transfer_id, false);
    }
    if !released.is_empty() {
        // Wake a pull of this decoder still waiting for a released transfer.
        inner.changed.notify_waiters();
    }
}

/// One pass over the pending requests: takes those whose slot is ready
/// (marking it sending), fails those released, aborted or unknown past the
/// grace, and keeps the rest pending.
fn claim_ready(
    inner: &Inner,
    pending: &mut Vec<Pending>,
    who: &str,
    plan: &MessagePlan,
    unknown_deadline: tokio::time::Instant,
) -> Pass {
    let mut pass = Pass::default();
    let now = tokio::time::Instant::now();
    let mut slots = inner.slots.lock().unwrap();
    pending.retain_mut(|p| match slots.get_mut(&p.transfer_id) {
        // The decoder gave this request up while we waited (it sent a
        // release): end without touching its blocks.
        Some(s) if s.released_by.iter().any(|w| w == who) => {
            pass.failed.push((
                p.d_req_id.clone(),
                format!("transfer {} was released by the decoder", p.transfer_id),
            ));
            false
        }
        Some(s) if s.expected || !matches!(s.state, SlotState::Placeholder { .. }) => {
            claim_known(s, p, plan, &mut pass)
        }
        _ if now < unknown_deadline => {
            pass.waiting_unknown = true;
            true
        }
        _ => {
            pass.failed.push((
                p.d_req_id.clone(),
                format!(
                    "transfer {} is unknown to this prefill worker (never started, or already sent, released or expired)",
                    p.transfer_id
                ),
            ));
            false
        }
    });
    pass
}

/// A pending request whose transfer this worker knows: true while it must
/// keep waiting.
fn claim_known(s: &mut SendSlot, p: &mut Pending, plan: &MessagePlan, pass: &mut Pass) -> bool {
    match &s.state {
        SlotState::Ready {
            p_req_id, blocks, ..
        } => {
            s.need_send.get_or_insert(plan.need_send);
            s.sending += 1;
            pass.ready.push(ReadyReq {
                d_req_id: p.d_req_id.clone(),
                transfer_id: p.transfer_id.clone(),
                p_req_id: p_req_id.clone(),
                p_blocks: blocks.clone(),
                d_blocks: std::mem::take(&mut p.d_blocks),
            });
            false
        }
        SlotState::Aborted { .. } => {
            pass.failed.push((
                p.d_req_id.clone(),
                format!("prefill request for transfer {} was aborted", p.transfer_id),
            ));
            false
        }
        SlotState::Placeholder { .. } => {
            s.need_send.get_or_insert(plan.need_send);
            true
        }
    }
}

/// Writes what a pass found ready and builds the answer for it: `Finish`
/// when nothing is left pending (`done`), else `Continue`.
async fn answer_pass(
    inner: &Arc<Inner>,
    session: &str,
    plan: &MessagePlan,
    pass: Pass,
    mut ok_reqs: Vec<String>,
    done: bool,
) -> XferResponse {
    let (ok, mut errs) = if pass.ready.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        write_ready(inner, session, plan, pass.ready).await
    };
    errs.extend(pass.failed);
    ok_reqs.extend(ok);
    let err_msg = (!errs.is_empty()).then(|| {
        errs.iter()
            .map(|(_, m)| m.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    });
    let err_reqs = (!errs.is_empty()).then(|| errs.into_iter().map(|(d, _)| d).collect());
    XferResponse {
        status: if done {
            XferStatus::Finish
        } else {
            XferStatus::Continue
        },
        ok_reqs: Some(ok_reqs),
        err_reqs,
        err_msg,
    }
}

/// The answer to a message with nothing left to wait for.
fn finish_ok(ok_reqs: Vec<String>) -> XferResponse {
    XferResponse {
        status: XferStatus::Finish,
        ok_reqs: Some(ok_reqs),
        err_reqs: None,
        err_msg: None,
    }
}

/// The answer when the abort timeout passed with requests still waiting.
fn timed_out(pending: &[Pending], ok_first: Vec<String>, session: &str) -> XferResponse {
    let err_reqs: Vec<String> = pending.iter().map(|p| p.d_req_id.clone()).collect();
    tracing::warn!(target: "mooncake_connector::producer",
        "timeout waiting for P side ready: {err_reqs:?} from {session}");
    XferResponse {
        status: XferStatus::Finish,
        ok_reqs: (!ok_first.is_empty()).then_some(ok_first),
        err_reqs: Some(err_reqs),
        err_msg: Some("Timeout waiting for P side ready.".into()),
    }
}
