//! Serving one pull message: sort its requests, wait for their slots,
//! write the ready ones and answer (`Continue` until the last, `Finish`).
use std::sync::Arc;

use bytes::Bytes;
use zeromq::{SocketSend, ZmqMessage};

use super::slots::{SendSlot, SlotState};
use super::vet::{vet_pull, MessagePlan};
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
    match vet_pull(&inner.ctx.layout, inner.ctx.spec.num_blocks, &payload) {
        Ok((meta, plan)) => serve_pull(inner, meta, plan, reply).await,
        Err(e) => {
            tracing::warn!(target: "mooncake_connector::producer", "refusing a pull: {}", e.detail);
            reply.send(&XferResponse::error(e.detail)).await;
        }
    }
}

pub(super) async fn serve_pull(
    inner: Arc<Inner>,
    meta: XferMetadata,
    plan: MessagePlan,
    mut reply: Reply,
) {
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
