//! Where a worker's KV lives and which regions and ranks pair up.
use std::collections::HashMap;

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
