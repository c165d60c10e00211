//! Where a worker's KV lives and which regions and ranks pair up.
use std::collections::HashMap;
use std::ops::Range;

use crate::connector::error::{ConnectorError, ConnectorErrorCode};
use crate::connector::protocol::XferMetadata;

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

/// How a model's KV heads are spread over TP ranks. Every block is
/// head-major, so a rank's heads are one contiguous slice of a block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KvHeads {
    /// Heads split evenly over the ranks of either side, whatever their
    /// number (the TP sizes must divide one another): the plan vLLM uses
    /// for head-sharded attention.
    #[default]
    Split,
    /// This many KV heads: split over the ranks when TP ≤ heads, else each
    /// rank holds one head, the same head on TP ÷ heads ranks (replicated
    /// KV). One rank of each replica group sends.
    Heads(usize),
    /// Multi-head latent attention: one latent per token, the same on every
    /// rank. One producer rank sends the whole block to each consumer rank.
    Mla,
}

impl KvHeads {
    /// The heads rank `rank` of a TP-`tp` engine holds, counted in units
    /// that both sides share (`other_tp` is the peer's TP size); Err when
    /// the head count and the TP size do not divide one another.
    pub fn rank_heads(
        self,
        tp: usize,
        rank: usize,
        other_tp: usize,
    ) -> Result<Range<usize>, ConnectorError> {
        let n = match self {
            KvHeads::Split => tp.max(other_tp),
            KvHeads::Heads(n) => n,
            KvHeads::Mla => 1,
        };
        if n == 0 || tp == 0 || rank >= tp {
            return Err(layout_err(format!(
                "rank {rank} of TP {tp} with {n} KV heads"
            )));
        }
        if tp <= n {
            if !n.is_multiple_of(tp) {
                return Err(layout_err(format!(
                    "{n} KV heads cannot be split over TP {tp}"
                )));
            }
            let per = n / tp;
            Ok(rank * per..(rank + 1) * per)
        } else {
            if !tp.is_multiple_of(n) {
                return Err(layout_err(format!(
                    "TP {tp} is not a multiple of the {n} KV heads it replicates"
                )));
            }
            let h = rank / (tp / n);
            Ok(h..h + 1)
        }
    }
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
    /// PP size of its engine.
    pub pp_size: usize,
    /// Its PP rank (its stage owns `regions`' layers).
    pub pp_rank: usize,
    /// How KV heads are spread over TP ranks (a producer's own model; a
    /// pull message does not carry it, the model is the same on both
    /// sides).
    pub heads: KvHeads,
}

pub(super) fn layout_err(msg: impl Into<String>) -> ConnectorError {
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
            pp_size: m.remote_pp_size as usize,
            // A pull message does not say which stage it comes from: its
            // layer names do.
            pp_rank: 0,
            heads: KvHeads::Split,
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
        m.remote_pp_size = self.pp_size as u64;
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
/// of that name); by position (equal counts) when either side has no names.
/// Every producer region must find its partner; consumer regions without
/// one are left alone. See [`align_stage_regions`] for a decoder whose PP
/// split differs.
pub fn align_regions(
    p: &[KvRegion],
    d: &[KvRegion],
) -> Result<Vec<(usize, usize)>, ConnectorError> {
    align(p, d, false)
}

/// Like [`align_regions`], for a decoder with PP > 1 whose split differs
/// from the producer's: producer layers the decoder's stage does not have
/// are skipped (which may leave no pair at all); a missing later occurrence
/// of a layer it has is still an error. Names are required.
pub fn align_stage_regions(
    p: &[KvRegion],
    d: &[KvRegion],
) -> Result<Vec<(usize, usize)>, ConnectorError> {
    align(p, d, true)
}

fn align(
    p: &[KvRegion],
    d: &[KvRegion],
    partial: bool,
) -> Result<Vec<(usize, usize)>, ConnectorError> {
    let named =
        p.iter().all(|r| !r.layer_name.is_empty()) && d.iter().all(|r| !r.layer_name.is_empty());
    if partial && !named {
        return Err(layout_err(
            "stages of different PP sizes are matched by layer name, and a side sent none",
        ));
    }
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
        let d_has_layer: std::collections::HashSet<&str> =
            d.iter().map(|r| r.layer_name.as_str()).collect();
        let mut out = Vec::with_capacity(p.len());
        for (i, r) in p.iter().enumerate() {
            let o = seen.entry(&r.layer_name).or_default();
            let key = (r.layer_name.as_str(), *o);
            *o += 1;
            match d_keys.get(&key) {
                Some(&j) => out.push((i, j)),
                // A layer the decoder's stage does not have at all; a
                // missing later occurrence of a layer it has is an error.
                None if partial && !d_has_layer.contains(key.0) => {}
                None => {
                    return Err(layout_err(format!(
                        "layer {} (occurrence {}) is missing on the decode side",
                        key.0, key.1
                    )))
                }
            }
        }
        // Decoder regions without a producer partner (a decoder-only draft
        // layer, say) are not written, as in vLLM.
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
