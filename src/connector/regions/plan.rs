//! Which bytes move: per-pair byte plans, block selection and the
//! transfer descriptors of a request.
use super::layout::{check_tp_sizes, layout_err, target_ranks, KvHeads, KvLayout, KvRegion};
use crate::connector::error::{ConnectorError, ConnectorErrorCode};
use crate::connector::protocol::GroupBlocks;

/// Which bytes of a block move from one producer rank to one consumer rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

/// vLLM's sender byte plan for one region pair (head-major blocks) of a
/// head-sharded model: [`pair_plan`] with [`KvHeads::Split`].
pub fn sender_plan(
    p: &KvRegion,
    d: &KvRegion,
    p_tp: usize,
    p_rank: usize,
    d_tp: usize,
    d_rank: usize,
) -> Result<CopyPlan, ConnectorError> {
    pair_plan(p, d, KvHeads::Split, p_tp, p_rank, d_tp, d_rank)?.ok_or_else(|| {
        layout_err(format!(
            "P tp_rank {p_rank} holds none of D tp_rank {d_rank}'s heads"
        ))
    })
}

/// Which bytes of each block producer rank `p_rank` (of TP `p_tp`) writes
/// to consumer rank `d_rank` (of TP `d_tp`) for one region pair, or None
/// when it writes nothing: it holds none of that rank's heads, or another
/// producer rank the consumer pulls from holds the same heads and sends
/// them (replicated KV and MLA: one rank of each replica group sends).
///
/// Blocks are head-major, so what moves is one contiguous run of heads:
/// the heads both ranks hold, at their offsets in each block. The bytes per
/// head must agree on both sides. For many regions of one rank pair, work
/// out the [`HeadShare`] once and call [`HeadShare::plan`] per region.
pub fn pair_plan(
    p: &KvRegion,
    d: &KvRegion,
    heads: KvHeads,
    p_tp: usize,
    p_rank: usize,
    d_tp: usize,
    d_rank: usize,
) -> Result<Option<CopyPlan>, ConnectorError> {
    HeadShare::new(heads, p_tp, p_rank, d_tp, d_rank)?.plan(p, d)
}

/// The heads one producer rank and one consumer rank hold, and the run of
/// them the producer sends (None: it sends nothing). It depends on the
/// ranks only, not on the region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadShare {
    p: std::ops::Range<usize>,
    d: std::ops::Range<usize>,
    send: Option<std::ops::Range<usize>>,
}

impl HeadShare {
    /// The share of producer rank `p_rank` (TP `p_tp`) with consumer rank
    /// `d_rank` (TP `d_tp`).
    pub fn new(
        heads: KvHeads,
        p_tp: usize,
        p_rank: usize,
        d_tp: usize,
        d_rank: usize,
    ) -> Result<Self, ConnectorError> {
        check_tp_sizes(p_tp, d_tp)?;
        let p = heads.rank_heads(p_tp, p_rank, d_tp)?;
        let d = heads.rank_heads(d_tp, d_rank, p_tp)?;
        let (lo, hi) = (p.start.max(d.start), p.end.min(d.end));
        let mut send = (lo < hi).then_some(lo..hi);
        // Among the producer ranks this consumer rank pulls from, the
        // lowest one holding these heads sends them.
        if send.is_some() {
            for q in target_ranks(d_tp, p_tp, d_rank) {
                if q >= p_rank {
                    break;
                }
                if heads.rank_heads(p_tp, q, d_tp)? == p {
                    send = None;
                    break;
                }
            }
        }
        Ok(Self { p, d, send })
    }

    /// The byte plan for one region pair; Err when the bytes per head
    /// differ between the two sides (checked whether or not this rank
    /// sends).
    pub fn plan(&self, p: &KvRegion, d: &KvRegion) -> Result<Option<CopyPlan>, ConnectorError> {
        let name = &p.layer_name;
        let (pn, dn) = (self.p.len() as u64, self.d.len() as u64);
        if !p.kv_block_len.is_multiple_of(pn) || !d.kv_block_len.is_multiple_of(dn) {
            return Err(layout_err(format!(
                "layer {name:?}: kv_block_len {} / {} does not split into {pn} / {dn} heads",
                p.kv_block_len, d.kv_block_len
            )));
        }
        let per_head = p.kv_block_len / pn;
        if d.kv_block_len / dn != per_head {
            return Err(layout_err(format!(
                "layer {name:?}: {} bytes per head per block on the prefill side (kv_block_len {} over {pn} heads), {} on the decode side (kv_block_len {} over {dn}); the model must be the same on both sides",
                per_head,
                p.kv_block_len,
                d.kv_block_len / dn,
                d.kv_block_len
            )));
        }
        let Some(send) = &self.send else {
            return Ok(None);
        };
        let plan = CopyPlan {
            src_offset: (send.start - self.p.start) as u64 * per_head,
            dst_offset: (send.start - self.d.start) as u64 * per_head,
            len: send.len() as u64 * per_head,
            whole_blocks: false,
        };
        let whole = plan.src_offset == 0
            && plan.dst_offset == 0
            && plan.len == p.block_len
            && plan.len == d.block_len;
        Ok(Some(CopyPlan {
            whole_blocks: whole,
            ..plan
        }))
    }
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

/// One region of a [`BlockList`]: block `k` is `len` bytes at `src + k *
/// src_stride` on the producer and `dst + k * dst_stride` on the consumer
/// (addresses as the layouts give them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSpan {
    /// Producer address of block 0 (the plan's offset inside a block included).
    pub src: u64,
    /// Consumer address of block 0 (offset included).
    pub dst: u64,
    /// Producer bytes from one block to the next.
    pub src_stride: u64,
    /// Consumer bytes from one block to the next.
    pub dst_stride: u64,
    /// Bytes per block.
    pub len: u64,
}

/// A request's transfer for one KV-cache group as a block list: every
/// region of the group moves the same block ids, so the engine takes the
/// regions and the ids once (`mooncake::Batch::submit_blocks`) instead of
/// one descriptor per region and block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockList {
    /// The group's region pairs.
    pub regions: Vec<BlockSpan>,
    /// Producer block ids.
    pub src_ids: Vec<u64>,
    /// Consumer block ids, one per producer id.
    pub dst_ids: Vec<u64>,
}

impl BlockList {
    /// Pieces (regions × ids): the per-block descriptors the list stands for.
    pub fn pieces(&self) -> usize {
        self.regions.len() * self.src_ids.len()
    }

    /// Bytes the list moves.
    pub fn bytes(&self) -> u64 {
        self.regions.iter().map(|r| r.len).sum::<u64>() * self.src_ids.len() as u64
    }
}

/// The same transfer as [`request_descriptors`], as one [`BlockList`] per
/// group that moves blocks. Ids and addresses are checked as there: the
/// highest id's block must not overflow on either side.
pub fn request_block_lists(
    p: &KvLayout,
    d: &KvLayout,
    pairs: &[(usize, usize)],
    plans: &[CopyPlan],
    blocks: &[BlockPairs],
    out: &mut Vec<BlockList>,
) -> Result<(), ConnectorError> {
    let mut list_of_group: Vec<Option<usize>> = vec![None; blocks.len()];
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
        if src_ids.is_empty() {
            continue;
        }
        // The highest id on each side bounds every block's address.
        let fits = |base: u64, ids: &[u64], stride: u64, off: u64| {
            let hi = ids.iter().copied().max().unwrap_or(0);
            hi.checked_mul(stride)
                .and_then(|x| x.checked_add(base))
                .and_then(|x| x.checked_add(off))
                .and_then(|x| x.checked_add(plan.len))
                .is_some()
        };
        if !fits(pr.base, src_ids, pr.block_len, plan.src_offset)
            || !fits(dr.base, dst_ids, dr.block_len, plan.dst_offset)
        {
            return Err(layout_err(format!(
                "a block of region {:?} is outside the address space",
                pr.layer_name
            )));
        }
        let at = *list_of_group[group].get_or_insert_with(|| {
            out.push(BlockList {
                regions: Vec::new(),
                src_ids: src_ids.clone(),
                dst_ids: dst_ids.clone(),
            });
            out.len() - 1
        });
        out[at].regions.push(BlockSpan {
            src: pr.base + plan.src_offset,
            dst: dr.base + plan.dst_offset,
            src_stride: pr.block_len,
            dst_stride: dr.block_len,
            len: plan.len,
        });
    }
    Ok(())
}
