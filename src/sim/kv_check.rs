//! Writing and checking the simulated model's KV in the workers' caches:
//! what the prefill "computes" and what a decoder verifies byte for byte.
use crate::connector::WorkerContext;

use super::model::{check_block, fill_block, ModelSpec};

/// Writes the model's KV of `tokens` into `blocks` on every rank (`ranks`
/// in TP-rank order). Err names a block outside a rank's cache.
pub fn fill_kv<'a>(
    spec: &ModelSpec,
    ranks: impl IntoIterator<Item = &'a WorkerContext>,
    tokens: &[u32],
    blocks: &[u64],
) -> Result<(), String> {
    let ranks: Vec<&WorkerContext> = ranks.into_iter().collect();
    let tp = ranks.len();
    let mut buf = vec![0u8; spec.kv_block_len(tp)];
    for (rank, ctx) in ranks.iter().enumerate() {
        for layer in 0..spec.layers {
            for (i, &b) in blocks.iter().enumerate() {
                fill_block(spec, tp, rank, layer, tokens, i, &mut buf);
                ctx.kv
                    .write_shared(ctx.block_offset(layer, b), &buf)
                    .map_err(|e| format!("rank {rank} layer {layer} block {b}: {e}"))?;
            }
        }
    }
    Ok(())
}

/// Checks the KV of `tokens` in `blocks` on every rank (every position but
/// the last, which a decoder recomputes itself); Ok(digest) or the first
/// wrong (rank, layer, position, head).
pub fn verify_kv<'a>(
    spec: &ModelSpec,
    ranks: impl IntoIterator<Item = &'a WorkerContext>,
    tokens: &[u32],
    blocks: &[u64],
) -> Result<u64, String> {
    let ranks: Vec<&WorkerContext> = ranks.into_iter().collect();
    let tp = ranks.len();
    let limit = tokens.len().saturating_sub(1);
    let mut digest = 0u64;
    let mut buf = vec![0u8; spec.kv_block_len(tp)];
    for (rank, ctx) in ranks.iter().enumerate() {
        for layer in 0..spec.layers {
            for (i, &b) in blocks
                .iter()
                .enumerate()
                .take(spec.blocks_for(limit.max(1)))
            {
                ctx.kv
                    .read_at(ctx.block_offset(layer, b), &mut buf)
                    .map_err(|e| format!("rank {rank} layer {layer} block {b}: {e}"))?;
                if let Some((pos, head)) =
                    check_block(spec, tp, rank, layer, tokens, i, limit, &buf, &mut digest)
                {
                    return Err(format!(
                        "rank {rank} layer {layer}: wrong KV at position {pos}, head {head}"
                    ));
                }
            }
        }
    }
    Ok(digest)
}
