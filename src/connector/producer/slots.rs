//! Send slots: one per `transfer_id`, from placeholder to ready (or
//! aborted) to finished, and the expiry sweep.
use std::time::Instant;

use super::{Inner, ProducerEvent};
use crate::connector::protocol::GroupBlocks;
use crate::connector::stats::ConnectorStats;

#[derive(Debug)]
pub(super) enum SlotState {
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
pub(super) struct SendSlot {
    pub(super) state: SlotState,
    pub(super) need_send: Option<usize>,
    pub(super) sent: usize,
    pub(super) sending: usize,
    /// The engine announced this transfer (or finished it): a pull may
    /// wait for it up to the abort timeout. A pull for a transfer nobody
    /// announced waits only `unknown_transfer_wait`.
    pub(super) expected: bool,
    /// Decoder ranks (`host:port#rank`) that released this transfer: a pull
    /// of theirs still waiting for it ends without writing, so the decoder
    /// may free its blocks at once.
    pub(super) released_by: Vec<String>,
}

impl SendSlot {
    /// A slot known only by its transfer id: the decoder asked (or the
    /// prefill finished) before the other side showed up.
    pub(super) fn placeholder() -> Self {
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

impl Inner {
    pub(super) fn sweep(&self) {
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
    pub(super) fn count_sent(&self, transfer_id: &str, was_sending: bool) {
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

    pub(super) fn end_sending_failed(&self, transfer_id: &str) {
        if let Some(s) = self.slots.lock().unwrap().get_mut(transfer_id) {
            s.sending = s.sending.saturating_sub(1);
        }
    }
}
