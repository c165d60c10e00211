//! Writing and checking the simulated model's KV in the workers' caches:
//! what the prefill "computes" and what a decoder verifies byte for byte.
use crate::connector::WorkerContext;

use super::model::{check_block, fill_block, ModelSpec};

/// Writes the model's KV of `tokens` into `blocks` (block ids per KV-cache
/// group) on every worker in `ranks` (each its TP rank's heads and its PP
/// stage's layers). Err names a block outside a worker's cache.
pub fn fill_kv<'a>(
    spec: &ModelSpec,
    ranks: impl IntoIterator<Item = &'a WorkerContext>,
    tokens: &[u32],
    blocks: &[Vec<u64>],
) -> Result<(), String> {
    for ctx in ranks {
        let (tp, rank) = (ctx.layout.tp_size, ctx.layout.tp_rank);
        for (ri, region) in ctx.layout.regions.iter().enumerate() {
            let layer = region.layer_index as usize;
            let ids = group_blocks(blocks, region.group_index)?;
            let mut buf = vec![0u8; region.kv_block_len as usize];
            for (i, &b) in ids.iter().enumerate() {
                fill_block(spec, tp, rank, layer, tokens, i, &mut buf);
                ctx.kv
                    .write_shared(ctx.block_offset(ri, b), &buf)
                    .map_err(|e| format!("rank {rank} layer {layer} block {b}: {e}"))?;
            }
        }
    }
    Ok(())
}

/// Checks the KV of `tokens` in `blocks` on every worker (every position
/// but the last, which a decoder recomputes itself); Ok(digest) or the
/// first wrong (rank, layer, position, head).
pub fn verify_kv<'a>(
    spec: &ModelSpec,
    ranks: impl IntoIterator<Item = &'a WorkerContext>,
    tokens: &[u32],
    blocks: &[Vec<u64>],
) -> Result<u64, String> {
    let limit = tokens.len().saturating_sub(1);
    let mut digest = 0u64;
    for ctx in ranks {
        let (tp, rank) = (ctx.layout.tp_size, ctx.layout.tp_rank);
        for (ri, region) in ctx.layout.regions.iter().enumerate() {
            let layer = region.layer_index as usize;
            let group = region.group_index as usize;
            let ids = group_blocks(blocks, region.group_index)?;
            let mut buf = vec![0u8; region.kv_block_len as usize];
            for (i, &b) in ids
                .iter()
                .enumerate()
                .take(spec.group_blocks_for(limit.max(1), group))
            {
                ctx.kv
                    .read_at(ctx.block_offset(ri, b), &mut buf)
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

fn group_blocks(blocks: &[Vec<u64>], group: i64) -> Result<&[u64], String> {
    usize::try_from(group)
        .ok()
        .and_then(|g| blocks.get(g))
        .map(Vec::as_slice)
        .ok_or_else(|| format!("no block ids for KV-cache group {group}"))
}
