//! Block lists: a KV transfer as regions and block ids (see
//! [`Batch::submit_blocks`](crate::Batch::submit_blocks)).
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::memory::LocalMemory;
use crate::sys;

/// One region of a block list, typically one layer's K or V tensor on both
/// sides: block `k` is `block_len` bytes at `local_offset + k *
/// local_stride` of the local memory and at `remote_addr + k *
/// remote_stride` in the remote segment.
///
/// The same block ids apply to every region of a list, as a KV transfer
/// names the same blocks in every layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRegion {
    /// Offset of block 0 in the local memory.
    pub local_offset: u64,
    /// Address of block 0 in the remote segment.
    pub remote_addr: u64,
    /// Bytes from one local block to the next.
    pub local_stride: u64,
    /// Bytes from one remote block to the next.
    pub remote_stride: u64,
    /// Bytes moved per block.
    pub block_len: u64,
}

impl BlockRegion {
    /// A region whose blocks follow each other on both sides (stride =
    /// `block_len`).
    pub fn packed(local_offset: u64, remote_addr: u64, block_len: u64) -> Self {
        Self {
            local_offset,
            remote_addr,
            local_stride: block_len,
            remote_stride: block_len,
            block_len,
        }
    }
}

/// The engine's regions for `regions` over `local`, after the checks on
/// what the caller passed: equal id counts, at least one region and id, and
/// every region's local blocks inside the memory. The engine checks the
/// rest (bounds, distinct destination ids, strides, the remote side) and
/// names the cause when it refuses.
pub(crate) fn engine_regions<L: LocalMemory + ?Sized>(
    raw: &Arc<crate::ffi::RawEngine>,
    local: &L,
    regions: &[BlockRegion],
    local_ids: &[u64],
    remote_ids: &[u64],
) -> Result<Vec<sys::mc_block_region_t>> {
    if local_ids.len() != remote_ids.len() {
        return Err(Error::InvalidArgument(format!(
            "block list: {} local ids but {} remote ids",
            local_ids.len(),
            remote_ids.len()
        )));
    }
    if regions.is_empty() || local_ids.is_empty() {
        return Err(Error::InvalidArgument(
            "block list: at least one region and one block id are needed".into(),
        ));
    }
    let (lo, hi) = local_ids
        .iter()
        .fold((u64::MAX, 0), |(lo, hi), &id| (lo.min(id), hi.max(id)));
    let mut out = Vec::with_capacity(regions.len());
    for (i, r) in regions.iter().enumerate() {
        let span = lo
            .checked_mul(r.local_stride)
            .and_then(|a| a.checked_add(r.local_offset))
            .zip(
                hi.checked_mul(r.local_stride)
                    .and_then(|b| b.checked_add(r.local_offset))
                    .and_then(|b| b.checked_add(r.block_len)),
            )
            .and_then(|(start, end)| {
                Some((
                    usize::try_from(start).ok()?,
                    usize::try_from(end - start).ok()?,
                ))
            });
        let Some((start, len)) = span else {
            return Err(Error::InvalidArgument(format!(
                "block list: region {i}: local blocks {lo}..={hi} overflow the address space"
            )));
        };
        let first = crate::memory::local_range(local, raw, start, len).map_err(|e| match e {
            Error::InvalidArgument(m) => {
                Error::InvalidArgument(format!("block list: region {i}: {m}"))
            }
            other => other,
        })?;
        // Block 0's address (`local_offset` into the memory): the span of
        // the ids starts `lo` strides above it.
        let base = (first as u64).wrapping_sub(lo.wrapping_mul(r.local_stride));
        out.push(sys::mc_block_region_t {
            local_base: base,
            remote_base: r.remote_addr,
            local_stride: r.local_stride,
            remote_stride: r.remote_stride,
            block_len: r.block_len,
        });
    }
    Ok(out)
}
