//! Counters a connector exposes (bytes, transfers, failures, expired slots).
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Live counters, shared by a process's workers.
#[derive(Debug, Default)]
pub struct ConnectorStats {
    /// Requests whose KV was written to a decoder.
    pub transfers_ok: AtomicU64,
    /// Requests whose KV write failed.
    pub transfers_failed: AtomicU64,
    /// KV bytes written.
    pub bytes_sent: AtomicU64,
    /// Transfer descriptors submitted.
    pub descriptors_sent: AtomicU64,
    /// Send slots freed because the decoder never pulled them.
    pub expired_slots: AtomicU64,
    /// Send slots released by an empty pull (decoder aborted the request).
    pub released_slots: AtomicU64,
    /// Requests a decoder pulled successfully.
    pub pulls_ok: AtomicU64,
    /// Requests a decoder failed to pull.
    pub pulls_failed: AtomicU64,
    /// KV bytes received by a decoder.
    pub bytes_received: AtomicU64,
}

/// A point-in-time copy of [`ConnectorStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[allow(missing_docs)]
pub struct StatsSnapshot {
    pub transfers_ok: u64,
    pub transfers_failed: u64,
    pub bytes_sent: u64,
    pub descriptors_sent: u64,
    pub expired_slots: u64,
    pub released_slots: u64,
    pub pulls_ok: u64,
    pub pulls_failed: u64,
    pub bytes_received: u64,
}

impl ConnectorStats {
    /// Adds `n` to a counter.
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// A copy of every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            transfers_ok: g(&self.transfers_ok),
            transfers_failed: g(&self.transfers_failed),
            bytes_sent: g(&self.bytes_sent),
            descriptors_sent: g(&self.descriptors_sent),
            expired_slots: g(&self.expired_slots),
            released_slots: g(&self.released_slots),
            pulls_ok: g(&self.pulls_ok),
            pulls_failed: g(&self.pulls_failed),
            bytes_received: g(&self.bytes_received),
        }
    }
}
