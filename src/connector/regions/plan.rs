//! Which bytes move: per-pair byte plans, block selection and the
//! transfer descriptors of a request.
use super::layout::{check_tp_sizes, layout_err, KvLayout, KvRegion};
use crate::connector::error::{ConnectorError, ConnectorErrorCode};
use crate::connector::protocol::GroupBlocks;

/// Which bytes of a block move from one producer rank to one consumer rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyPlan {
    /// Offset inside the producer's block.
    pub src_offset: u64,
    /// Offset inside the consumer's block.
    pub dst_offset: u64,
    /// Bytes per block.
    pub len: u64,
    /// True when whole, contiguous blocks move on both sides, so runs of
    /// consecutive blocks can be merged into one descriptor.
    pub whole_blocks: bool,
}

/// vLLM's sender byte plan for one region pair (head-major blocks).
pub fn sender_plan(
    p: &KvRegion,
    d: &KvRegion,
    p_tp: usize,
    p_rank: usize,
    d_tp: usize,
    d_rank: usize,
) -> Result<CopyPlan, ConnectorError> {
    check_tp_sizes(p_tp, d_tp)?;
    let name = &p.layer_name;
    let plan = if p_tp == d_tp {
        if p.kv_block_len != d.kv_block_len {
            return Err(layout_err(format!(
                "layer {name:?}: kv_block_len {} on the prefill side, {} on the decode side (equal TP needs equal lengths)",
                p.kv_block_len, d.kv_block_len
            )));
        }
        CopyPlan {
            src_offset: 0,
            dst_offset: 0,
            len: p.kv_block_len,
            whole_blocks: false,
        }
    } else if p_tp > d_tp {
        // Each prefill rank holds fewer heads: its whole block lands in a
        // slice of the decoder's larger block.
        let k = (p_tp / d_tp) as u64;
        if d.kv_block_len != p.kv_block_len * k {
            return Err(layout_err(format!(
                "layer {name:?}: decode kv_block_len {} must be {k} × prefill kv_block_len {}",
                d.kv_block_len, p.kv_block_len
            )));
        }
        CopyPlan {
            src_offset: 0,
            dst_offset: (p_rank as u64 % k) * p.kv_block_len,
            len: p.kv_block_len,
            whole_blocks: false,
        }
    } else {
        // Each prefill rank holds more heads: each paired decoder gets its
        // slice.
        let k = (d_tp / p_tp) as u64;
        if p.kv_block_len != d.kv_block_len * k {
            return Err(layout_err(format!(
                "layer {name:?}: prefill kv_block_len {} must be {k} × decode kv_block_len {}",
                p.kv_block_len, d.kv_block_len
            )));
        }
        CopyPlan {
            src_offset: (d_rank as u64 % k) * d.kv_block_len,
            dst_offset: 0,
            len: d.kv_block_len,
            whole_blocks: false,
        }
    };
    let whole = plan.src_offset == 0
        && plan.dst_offset == 0
        && plan.len == p.block_len
        && plan.len == d.block_len;
    Ok(CopyPlan {
        whole_blocks: whole,
        ..plan
    })
}

/// Splits paired block lists into runs where both ids go up by one:
/// `(first src, first dst, length)`.
pub fn contiguous_runs(src: &[u64], dst: &[u64]) -> Vec<(u64, u64, u64)> {
    let mut out: Vec<(u64, u64, u64)> = Vec::new();
    for (&s, &t) in src.iter().zip(dst) {
        if let Some(last) = out.last_mut() {
            if last.0.checked_add(last.2) == Some(s) && last.1.checked_add(last.2) == Some(t) {
                last.2 += 1;
                continue;
            }
        }
        out.push((s, t, 1));
    }
    out
}

/// Producer and consumer block ids of one KV-cache group, paired by index.
pub type BlockPairs = (Vec<u64>, Vec<u64>);

/// Pairs a producer request's blocks with a consumer's, per KV-cache group.
/// The consumer sends only blocks it does not have cached, so the producer
/// keeps the *tail* of its list; a producer with fewer blocks than asked for
/// is an error.
pub fn select_blocks(p: &GroupBlocks, d: &GroupBlocks) -> Result<Vec<BlockPairs>, ConnectorError> {
    if p.len() != d.len() {
        return Err(layout_err(format!(
            "the prefill side has {} KV-cache groups, the decode side {}",
            p.len(),
            d.len()
        )));
    }
    p.iter()
        .zip(d)
        .enumerate()
        .map(|(g, (pb, db))| {
            if db.len() > pb.len() {
                return Err(ConnectorError::new(
                    ConnectorErrorCode::Layout,
                    format!("P num blocks less than D: group {g} has {} on the prefill side, {} asked for", pb.len(), db.len()),
                ));
            }
            Ok((pb[pb.len() - db.len()..].to_vec(), db.clone()))
        })
        .collect()
}

/// One transfer: `len` bytes from producer address `src` to consumer
/// address `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    /// Absolute source address (producer).
    pub src: u64,
    /// Absolute destination address (consumer).
    pub dst: u64,
    /// Bytes.
    pub len: u64,
}

/// The descriptors for one request, region by region.
pub fn request_descriptors(
    p: &KvLayout,
    d: &KvLayout,
    pairs: &[(usize, usize)],
    plans: &[CopyPlan],
    blocks: &[BlockPairs],
    out: &mut Vec<Descriptor>,
) -> Result<(), ConnectorError> {
    for (&(pi, di), plan) in pairs.iter().zip(plans) {
        let (pr, dr) = (&p.regions[pi], &d.regions[di]);
        let group = usize::try_from(pr.group_index)
            .ok()
            .filter(|g| *g < blocks.len())
            .ok_or_else(|| {
                layout_err(format!(
                    "region {:?} belongs to group {}, which the request does not have",
                    pr.layer_name, pr.group_index
                ))
            })?;
        let (src_ids, dst_ids) = &blocks[group];
        // Destination block ids come from the peer: every address is
        // computed with overflow checks.
        let addr = |base: u64, id: u64, stride: u64, off: u64, len: u64| {
            id.checked_mul(stride)
                .and_then(|x| x.checked_add(base))
                .and_then(|x| x.checked_add(off))
                .filter(|x| x.checked_add(len).is_some())
                .ok_or_else(|| {
                    layout_err(format!(
                        "block {id} of region {:?} is outside the address space",
                        pr.layer_name
                    ))
                })
        };
        if plan.whole_blocks {
            for (s, t, n) in contiguous_runs(src_ids, dst_ids) {
                let len = plan
                    .len
                    .checked_mul(n)
                    .ok_or_else(|| layout_err(format!("a run of {n} blocks is too long")))?;
                out.push(Descriptor {
                    src: addr(pr.base, s, pr.block_len, 0, len)?,
                    dst: addr(dr.base, t, dr.block_len, 0, len)?,
                    len,
                });
            }
        } else {
            for (&s, &t) in src_ids.iter().zip(dst_ids) {
                out.push(Descriptor {
                    src: addr(pr.base, s, pr.block_len, plan.src_offset, plan.len)?,
                    dst: addr(dr.base, t, dr.block_len, plan.dst_offset, plan.len)?,
                    len: plan.len,
                });
            }
        }
    }
    Ok(())
}
