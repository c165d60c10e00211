//! Writing ready requests into a decoder's memory: descriptors, one async
//! batch per message (at most `num_workers` at once), per-request outcome.
use std::sync::Arc;
use std::time::Instant;

use mooncake::{Error as EngineError, LocalMemory, RemoteSegment, TaskStatus};

use super::pull::ReadyReq;
use super::vet::MessagePlan;
use super::Inner;
use crate::connector::regions::{request_descriptors, select_blocks, Descriptor};
use crate::connector::stats::ConnectorStats;

/// Per descriptor of a batch, Ok or the engine's reason; Err when the whole
/// batch failed.
type BatchResult = Result<Vec<Result<(), String>>, String>;

/// A request and the range of its descriptors in the batch.
type Span = (ReadyReq, std::ops::Range<usize>);

/// Writes the ready requests of one message into the decoder, in one async
/// batch. Returns (ok d_req_ids, failed (d_req_id, why)).
pub(super) async fn write_ready(
    inner: &Arc<Inner>,
    session: &str,
    plan: &MessagePlan,
    ready: Vec<ReadyReq>,
) -> (Vec<String>, Vec<(String, String)>) {
    let mut failed = Vec::new();
    let (descs, spans) = batch_descriptors(inner, plan, ready, &mut failed);
    if spans.is_empty() {
        return (Vec::new(), failed);
    }
    let started = Instant::now();
    let descs = Arc::new(descs);
    // A stage that shares no layer with this decoder, or a replica whose
    // peer sends the heads, has nothing to write: success, no engine call.
    let result = if descs.is_empty() {
        Ok(Vec::new())
    } else {
        write_on_pool(inner, session, descs.clone()).await
    };
    let elapsed = started.elapsed();
    let mut ok = Vec::new();
    for (r, span) in spans {
        match span_outcome(&result, span.clone()) {
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

/// The descriptors of every request in `ready` that maps onto the
/// decoder's layout, with each one's span; the others go to `failed`.
fn batch_descriptors(
    inner: &Inner,
    plan: &MessagePlan,
    ready: Vec<ReadyReq>,
    failed: &mut Vec<(String, String)>,
) -> (Vec<Descriptor>, Vec<Span>) {
    let mut descs: Vec<Descriptor> = Vec::new();
    let mut spans: Vec<Span> = Vec::new();
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
    (descs, spans)
}

/// Runs the batch WRITE of `descs` once a writer permit is free
/// (`num_workers` batches at once). The transfer is an async batch: no
/// thread waits for it, the engine's reactor wakes this task.
async fn write_on_pool(
    inner: &Arc<Inner>,
    session: &str,
    descs: Arc<Vec<Descriptor>>,
) -> BatchResult {
    let _permit = inner
        .writers
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| "the producer is shutting down".to_string())?;
    let seg = decoder_segment(inner, session).await?;
    run_batch(inner, &seg, &descs).await
}

/// The decoder's segment, opened once per session and cached (the open, a
/// handshake bounded by the engine's timeouts, runs off the runtime).
async fn decoder_segment(inner: &Arc<Inner>, session: &str) -> Result<RemoteSegment, String> {
    if let Some(s) = inner.sessions.lock().unwrap().get(session).cloned() {
        return Ok(s);
    }
    let gate = inner
        .opening
        .lock()
        .unwrap()
        .entry(session.to_string())
        .or_default()
        .clone();
    let _turn = gate.lock().await;
    // The gate lives only while opens are in flight (a decoder that names
    // hosts nobody answers for must not grow the map): whoever finishes
    // removes it; tasks already waiting hold their own handle.
    let _cleanup = RemoveGate(inner, session);
    // Opened by the pull that held the gate before us?
    if let Some(s) = inner.sessions.lock().unwrap().get(session).cloned() {
        return Ok(s);
    }
    let opened = match inner.ctx.engine.open_segment_async(session) {
        Ok(open) => open.await,
        Err(e) => Err(e),
    }
    .map_err(|e| format!("cannot open decoder segment {session}: {e}"))?;
    inner
        .sessions
        .lock()
        .unwrap()
        .insert(session.to_string(), opened.clone());
    Ok(opened)
}

/// Removes a session's open gate when dropped.
struct RemoveGate<'a>(&'a Inner, &'a str);

impl Drop for RemoveGate<'_> {
    fn drop(&mut self) {
        if let Ok(mut m) = self.0.opening.lock() {
            m.remove(self.1);
        }
    }
}

/// One request's outcome: Ok when every descriptor in its `span` was
/// written.
fn span_outcome(result: &BatchResult, mut span: std::ops::Range<usize>) -> Result<(), String> {
    match result {
        Ok(per_desc) => match span.find_map(|i| per_desc[i].as_ref().err().map(|e| (i, e))) {
            None => Ok(()),
            Some((i, e)) => Err(format!("descriptor {i} of the batch failed: {e}")),
        },
        Err(why) => Err(why.clone()),
    }
}

/// One batch WRITE of `descs` to the decoder's segment `seg`: per
/// descriptor, Ok or the engine's reason.
pub(super) async fn run_batch(
    inner: &Inner,
    seg: &RemoteSegment,
    descs: &[Descriptor],
) -> BatchResult {
    let ctx = &inner.ctx;
    let kv = &ctx.kv;
    let base = kv.addr();
    let mut batch = ctx
        .engine
        .async_batch(descs.len())
        .map_err(|e| e.to_string())?;
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
            .write(kv, off as usize, seg, d.dst, d.len as usize)
            .map_err(|e| e.to_string())?;
    }
    match batch.run().await {
        Ok(()) | Err(EngineError::Transfer { .. }) => {}
        Err(e) => return Err(format!("Mooncake transfer engine returned {e}")),
    }
    // One pass over the statuses.
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
