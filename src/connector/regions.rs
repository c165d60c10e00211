//! KV geometry and transfer planning: pure functions, no I/O.
//!
//! A worker registers one region per layer (or per head slice): block `b`
//! of a region lives at `base + b × block_len`, with `kv_block_len` payload
//! bytes. A producer matches its regions with a consumer's by
//! (layer name, occurrence), pairs TP ranks, works out which bytes of each
//! block go where (heterogeneous TP needs a head-major block layout), and
//! turns block-id lists into transfer descriptors, merging runs of
//! consecutive blocks into one descriptor when whole blocks move.
use std::collections::HashMap;

use super::error::{ConnectorError, ConnectorErrorCode};
use super::protocol::{GroupBlocks, XferMetadata};

/// One registered KV region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvRegion {
    /// Absolute address of block 0.
    pub base: u64,
    /// Byte stride between blocks.
    pub block_len: u64,
    /// Payload bytes per block (≤ `block_len`).
    pub kv_block_len: u64,
    /// Layer name, e.g. `model.layers.0.self_attn.attn`.
    pub layer_name: String,
    /// Layer index.
    pub layer_index: i64,
    /// KV-cache group.
    pub group_index: i64,
}

/// One worker's KV layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    /// Its regions, in registration order.
    pub regions: Vec<KvRegion>,
    /// TP size of its engine.
    pub tp_size: usize,
    /// Its TP rank.
    pub tp_rank: usize,
}

fn layout_err(msg: impl Into<String>) -> ConnectorError {
    ConnectorError::new(ConnectorErrorCode::Layout, msg)
}

impl KvLayout {
    /// The consumer's layout as a pull message describes it.
    pub fn from_metadata(m: &XferMetadata) -> Result<Self, ConnectorError> {
        let n = m.kv_caches_base_addr.len();
        if m.block_lens.len() != n || m.kv_block_lens.len() != n {
            return Err(layout_err(format!(
                "pull message lists {n} base addresses but {} block_lens and {} kv_block_lens",
                m.block_lens.len(),
                m.kv_block_lens.len()
            )));
        }
        for (what, len) in [
            ("registered_layer_names", m.registered_layer_names.len()),
            ("registered_layer_indices", m.registered_layer_indices.len()),
            ("registered_group_indices", m.registered_group_indices.len()),
        ] {
            if len != 0 && len != n {
                return Err(layout_err(format!(
                    "pull message lists {n} regions but {len} {what}"
                )));
            }
        }
        if m.remote_tp_size == 0 || m.remote_tp_rank >= m.remote_tp_size {
            return Err(layout_err(format!(
                "pull message has tp_rank {} of tp_size {}",
                m.remote_tp_rank, m.remote_tp_size
            )));
        }
        let regions = (0..n)
            .map(|i| KvRegion {
                base: m.kv_caches_base_addr[i],
                block_len: m.block_lens[i],
                kv_block_len: m.kv_block_lens[i],
                layer_name: m.registered_layer_names.get(i).cloned().unwrap_or_default(),
                layer_index: m
                    .registered_layer_indices
                    .get(i)
                    .copied()
                    .unwrap_or(i as i64),
                group_index: m.registered_group_indices.get(i).copied().unwrap_or(0),
            })
            .collect::<Vec<_>>();
        for (i, r) in regions.iter().enumerate() {
            if r.kv_block_len == 0 || r.kv_block_len > r.block_len {
                return Err(layout_err(format!(
                    "region {i} has kv_block_len {} and block_len {}",
                    r.kv_block_len, r.block_len
                )));
            }
        }
        Ok(Self {
            regions,
            tp_size: m.remote_tp_size as usize,
            tp_rank: m.remote_tp_rank as usize,
        })
    }

    /// Distinct KV-cache groups (at least 1).
    pub fn num_groups(&self) -> usize {
        let mut g: Vec<i64> = self.regions.iter().map(|r| r.group_index).collect();
        g.sort_unstable();
        g.dedup();
        g.len().max(1)
    }

    /// Writes this (consumer) layout into a pull message.
    pub fn fill_metadata(&self, m: &mut XferMetadata) {
        m.remote_tp_size = self.tp_size as u64;
        m.remote_tp_rank = self.tp_rank as u64;
        m.kv_caches_base_addr = self.regions.iter().map(|r| r.base).collect();
        m.block_lens = self.regions.iter().map(|r| r.block_len).collect();
        m.kv_block_lens = self.regions.iter().map(|r| r.kv_block_len).collect();
        m.registered_layer_names = self.regions.iter().map(|r| r.layer_name.clone()).collect();
        m.registered_layer_indices = self.regions.iter().map(|r| r.layer_index).collect();
        m.registered_group_indices = self.regions.iter().map(|r| r.group_index).collect();
    }
}

/// The remote TP ranks a local rank talks to (vLLM's handshake targets):
/// with local TP ≥ remote TP and ratio k, remote rank `rank / k`; otherwise
/// remote ranks `rank·k .. rank·k + k − 1`.
pub fn target_ranks(local_tp: usize, remote_tp: usize, local_rank: usize) -> Vec<usize> {
    if local_tp >= remote_tp {
        let k = (local_tp / remote_tp.max(1)).max(1);
        vec![local_rank / k]
    } else {
        let k = remote_tp / local_tp.max(1);
        (local_rank * k..local_rank * k + k).collect()
    }
}

/// Checks that the two TP sizes divide one another.
pub fn check_tp_sizes(p_tp: usize, d_tp: usize) -> Result<(), ConnectorError> {
    if p_tp == 0 || d_tp == 0 || !p_tp.max(d_tp).is_multiple_of(p_tp.min(d_tp)) {
        return Err(layout_err(format!(
            "TP sizes {p_tp} (prefill) and {d_tp} (decode) do not divide one another"
        )));
    }
    Ok(())
}

/// Pairs producer regions with consumer regions by (layer name, occurrence
/// of that name); by position when either side has no names.
pub fn align_regions(
    p: &[KvRegion],
    d: &[KvRegion],
) -> Result<Vec<(usize, usize)>, ConnectorError> {
    let named =
        p.iter().all(|r| !r.layer_name.is_empty()) && d.iter().all(|r| !r.layer_name.is_empty());
    let pairs: Vec<(usize, usize)> = if named {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let d_keys: HashMap<(&str, usize), usize> = {
            let mut occ: HashMap<&str, usize> = HashMap::new();
            d.iter()
                .enumerate()
                .map(|(i, r)| {
                    let o = occ.entry(&r.layer_name).or_default();
                    *o += 1;
                    ((r.layer_name.as_str(), *o - 1), i)
                })
                .collect()
        };
        let mut out = Vec::with_capacity(p.len());
        for (i, r) in p.iter().enumerate() {
            let o = seen.entry(&r.layer_name).or_default();
            let key = (r.layer_name.as_str(), *o);
            *o += 1;
            let j = *d_keys.get(&key).ok_or_else(|| {
                layout_err(format!(
                    "layer {} (occurrence {}) is missing on the decode side",
                    key.0, key.1
                ))
            })?;
            out.push((i, j));
        }
        if out.len() != d.len() {
            return Err(layout_err(format!(
                "the prefill side has {} regions, the decode side {}",
                p.len(),
                d.len()
            )));
        }
        out
    } else {
        if p.len() != d.len() {
            return Err(layout_err(format!(
                "the prefill side has {} regions, the decode side {}",
                p.len(),
                d.len()
            )));
        }
        (0..p.len()).map(|i| (i, i)).collect()
    };
    for &(i, j) in &pairs {
        if p[i].layer_index != d[j].layer_index || p[i].group_index != d[j].group_index {
            return Err(layout_err(format!(
                "layer {:?}: index/group {}/{} on the prefill side, {}/{} on the decode side",
                p[i].layer_name,
                p[i].layer_index,
                p[i].group_index,
                d[j].layer_index,
                d[j].group_index
            )));
        }
    }
    Ok(pairs)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn region(name: &str, idx: i64, base: u64, block_len: u64, kv: u64) -> KvRegion {
        KvRegion {
            base,
            block_len,
            kv_block_len: kv,
            layer_name: name.into(),
            layer_index: idx,
            group_index: 0,
        }
    }

    #[test]
    fn rank_pairing_matches_vllm() {
        assert_eq!(target_ranks(2, 1, 0), [0]);
        assert_eq!(target_ranks(2, 1, 1), [0]);
        assert_eq!(target_ranks(1, 2, 0), [0, 1]);
        assert_eq!(target_ranks(2, 4, 1), [2, 3]);
        assert_eq!(target_ranks(4, 2, 3), [1]);
        assert_eq!(target_ranks(2, 2, 1), [1]);
        assert!(check_tp_sizes(2, 3).is_err());
        assert!(check_tp_sizes(4, 2).is_ok());
    }

    #[test]
    fn contiguous_ids_merge_and_gaps_split() {
        assert_eq!(contiguous_runs(&[1, 2, 3, 4], &[7, 8, 9, 10]), [(1, 7, 4)]);
        assert_eq!(
            contiguous_runs(&[1, 2, 4, 5], &[7, 8, 9, 10]),
            [(1, 7, 2), (4, 9, 2)]
        ); // gap in src
        assert_eq!(
            contiguous_runs(&[1, 2, 3], &[7, 9, 10]),
            [(1, 7, 1), (2, 9, 2)]
        ); // gap in dst
        assert_eq!(
            contiguous_runs(&[3, 2, 1], &[1, 2, 3]),
            [(3, 1, 1), (2, 2, 1), (1, 3, 1)]
        );
        assert!(contiguous_runs(&[], &[]).is_empty());
    }

    #[test]
    fn equal_tp_whole_blocks_give_one_descriptor_per_run_and_region() {
        let p = KvLayout {
            regions: vec![
                region("l0", 0, 1000, 64, 64),
                region("l1", 1, 100_000, 64, 64),
            ],
            tp_size: 1,
            tp_rank: 0,
        };
        let d = KvLayout {
            regions: vec![
                region("l1", 1, 900_000, 64, 64),
                region("l0", 0, 500_000, 64, 64),
            ],
            tp_size: 1,
            tp_rank: 0,
        };
        let pairs = align_regions(&p.regions, &d.regions).unwrap();
        assert_eq!(pairs, [(0, 1), (1, 0)]); // matched by name, not position
        let plans: Vec<_> = pairs
            .iter()
            .map(|&(i, j)| sender_plan(&p.regions[i], &d.regions[j], 1, 0, 1, 0).unwrap())
            .collect();
        assert!(plans.iter().all(|pl| pl.whole_blocks));
        let blocks = select_blocks(&vec![vec![4, 5, 6, 9]], &vec![vec![10, 11, 12, 13]]).unwrap();
        let mut out = Vec::new();
        request_descriptors(&p, &d, &pairs, &plans, &blocks, &mut out).unwrap();
        assert_eq!(
            out,
            [
                Descriptor {
                    src: 1000 + 4 * 64,
                    dst: 500_000 + 10 * 64,
                    len: 3 * 64
                },
                Descriptor {
                    src: 1000 + 9 * 64,
                    dst: 500_000 + 13 * 64,
                    len: 64
                },
                Descriptor {
                    src: 100_000 + 4 * 64,
                    dst: 900_000 + 10 * 64,
                    len: 3 * 64
                },
                Descriptor {
                    src: 100_000 + 9 * 64,
                    dst: 900_000 + 13 * 64,
                    len: 64
                },
            ]
        );
    }

    #[test]
    fn padded_pages_are_sent_block_by_block() {
        let p = region("l0", 0, 0x1000, 128, 96);
        let d = region("l0", 0, 0x9000, 128, 96);
        let plan = sender_plan(&p, &d, 1, 0, 1, 0).unwrap();
        assert!(!plan.whole_blocks);
        let pl = KvLayout {
            regions: vec![p],
            tp_size: 1,
            tp_rank: 0,
        };
        let dl = KvLayout {
            regions: vec![d],
            tp_size: 1,
            tp_rank: 0,
        };
        let mut out = Vec::new();
        request_descriptors(
            &pl,
            &dl,
            &[(0, 0)],
            &[plan],
            &[(vec![1, 2], vec![5, 6])],
            &mut out,
        )
        .unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(
            out[1],
            Descriptor {
                src: 0x1000 + 2 * 128,
                dst: 0x9000 + 6 * 128,
                len: 96
            }
        );
    }

    #[test]
    fn partial_prefix_hit_uses_the_tail() {
        let sel = select_blocks(&vec![vec![1, 2, 3, 4, 5]], &vec![vec![20, 21]]).unwrap();
        assert_eq!(sel, [(vec![4, 5], vec![20, 21])]);
        let err = select_blocks(&vec![vec![1]], &vec![vec![20, 21]]).unwrap_err();
        assert!(
            err.to_string().contains("P num blocks less than D"),
            "{err}"
        );
        assert!(select_blocks(&vec![vec![1]], &vec![vec![1], vec![2]]).is_err());
        // An empty decode list selects nothing (a release pull).
        assert_eq!(
            select_blocks(&vec![vec![1, 2]], &vec![vec![]]).unwrap(),
            [(vec![], vec![])]
        );
    }

    #[test]
    fn heterogeneous_tp_offsets() {
        // P TP 2 -> D TP 1: each P rank holds half the heads.
        let p = region("l0", 0, 0, 256, 256);
        let d = region("l0", 0, 0, 512, 512);
        let r0 = sender_plan(&p, &d, 2, 0, 1, 0).unwrap();
        let r1 = sender_plan(&p, &d, 2, 1, 1, 0).unwrap();
        assert_eq!(
            (r0.src_offset, r0.dst_offset, r0.len, r0.whole_blocks),
            (0, 0, 256, false)
        );
        assert_eq!((r1.src_offset, r1.dst_offset, r1.len), (0, 256, 256));
        // P TP 1 -> D TP 2: each D rank gets its half.
        let p = region("l0", 0, 0, 512, 512);
        let d = region("l0", 0, 0, 256, 256);
        let d0 = sender_plan(&p, &d, 1, 0, 2, 0).unwrap();
        let d1 = sender_plan(&p, &d, 1, 0, 2, 1).unwrap();
        assert_eq!((d0.src_offset, d0.dst_offset, d0.len), (0, 0, 256));
        assert_eq!((d1.src_offset, d1.dst_offset, d1.len), (256, 0, 256));
        // Lengths that do not match the ratio are refused.
        let bad = sender_plan(
            &region("l0", 0, 0, 512, 512),
            &region("l0", 0, 0, 300, 300),
            1,
            0,
            2,
            0,
        )
        .unwrap_err();
        assert!(bad.to_string().contains("kv_block_len"), "{bad}");
        let bad = sender_plan(
            &region("l0", 0, 0, 64, 64),
            &region("l0", 0, 0, 32, 32),
            1,
            0,
            1,
            0,
        )
        .unwrap_err();
        assert!(bad.to_string().contains("equal TP"), "{bad}");
    }

    #[test]
    fn alignment_errors() {
        let a = [region("l0", 0, 0, 64, 64), region("l1", 1, 0, 64, 64)];
        let missing = [region("l0", 0, 0, 64, 64), region("l2", 2, 0, 64, 64)];
        assert!(align_regions(&a, &missing)
            .unwrap_err()
            .to_string()
            .contains("l1"));
        let wrong_index = [region("l0", 0, 0, 64, 64), region("l1", 5, 0, 64, 64)];
        assert!(align_regions(&a, &wrong_index).is_err());
        // Repeated names (several regions per layer) pair by occurrence.
        let p = [region("l0", 0, 1, 64, 64), region("l0", 0, 2, 64, 64)];
        let d = [region("l0", 0, 3, 64, 64), region("l0", 0, 4, 64, 64)];
        assert_eq!(align_regions(&p, &d).unwrap(), [(0, 0), (1, 1)]);
        // No names: by position, counts must match.
        let un = |n: usize| {
            (0..n)
                .map(|i| region("", i as i64, 0, 64, 64))
                .collect::<Vec<_>>()
        };
        assert_eq!(align_regions(&un(2), &un(2)).unwrap(), [(0, 0), (1, 1)]);
        assert!(align_regions(&un(2), &un(3)).is_err());
    }

    #[test]
    fn layout_from_metadata_checks_lengths() {
        let mut m = XferMetadata {
            remote_hostname: "h".into(),
            remote_port: 1,
            remote_tp_size: 2,
            remote_tp_rank: 1,
            req_blocks: Default::default(),
            kv_caches_base_addr: vec![10, 20],
            block_lens: vec![64, 64],
            kv_block_lens: vec![64],
            registered_layer_names: vec![],
            registered_layer_indices: vec![],
            registered_group_indices: vec![],
            remote_pp_size: 1,
        };
        assert!(KvLayout::from_metadata(&m).is_err());
        m.kv_block_lens = vec![64, 128];
        assert!(KvLayout::from_metadata(&m)
            .unwrap_err()
            .to_string()
            .contains("kv_block_len"));
        m.kv_block_lens = vec![64, 64];
        let l = KvLayout::from_metadata(&m).unwrap();
        assert_eq!((l.tp_size, l.tp_rank, l.regions[1].base), (2, 1, 20));
        m.remote_tp_rank = 2;
        assert!(KvLayout::from_metadata(&m).is_err());
    }
}
