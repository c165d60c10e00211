//! KV geometry and transfer planning: pure functions, no I/O.
//!
//! A worker registers one region per layer (or per head slice): block `b`
//! of a region lives at `base + b × block_len`, with `kv_block_len` payload
//! bytes. A producer matches its regions with a consumer's by
//! (layer name, occurrence), pairs TP ranks, works out which bytes of each
//! block go where (heterogeneous TP needs a head-major block layout), and
//! turns block-id lists into transfer descriptors, merging runs of
//! consecutive blocks into one descriptor when whole blocks move.

mod layout;
mod plan;
#[cfg(test)]
mod tests;

pub use layout::{
    align_regions, align_stage_regions, check_tp_sizes, target_ranks, KvHeads, KvLayout, KvRegion,
};
pub use plan::{
    contiguous_runs, pair_plan, request_block_lists, request_descriptors, select_blocks,
    sender_plan, BlockList, BlockPairs, BlockSpan, CopyPlan, Descriptor, HeadShare,
};
