//! Checking and planning a pull message before any slot is touched.
use crate::connector::error::{ConnectorError, ConnectorErrorCode};
use crate::connector::protocol::{decode, PullBounds, XferMetadata};
use crate::connector::regions::{
    align_regions, align_stage_regions, check_tp_sizes, pair_plan, target_ranks, CopyPlan, KvLayout,
};

/// Decodes a pull message, validates every field against this worker's
/// layout (at most `num_blocks` per region, `num_groups` KV-cache groups)
/// and plans it. Nothing here trusts a
/// peer value: an Err is the reply, naming the field or the mismatch.
pub fn vet_pull(
    layout: &KvLayout,
    num_blocks: u64,
    num_groups: usize,
    payload: &[u8],
) -> Result<(XferMetadata, MessagePlan), ConnectorError> {
    let meta: XferMetadata = decode("MooncakeXferMetadata", payload)?;
    let bounds = PullBounds {
        num_blocks,
        num_groups,
    };
    meta.validate(&bounds)?;
    let plan = plan_message(layout, &meta).map_err(|e| {
        ConnectorError::new(
            e.code,
            format!(
                "refusing a pull from {}:{}: {}",
                meta.remote_hostname, meta.remote_port, e.detail
            ),
        )
    })?;
    Ok((meta, plan))
}

/// What one pull message needs, worked out before any slot is touched.
pub struct MessagePlan {
    /// The decoder's layout.
    pub d_layout: KvLayout,
    /// (producer region, consumer region) pairs.
    pub pairs: Vec<(usize, usize)>,
    /// The byte plan of each pair.
    pub plans: Vec<CopyPlan>,
    /// How many decoder workers (TP ranks × PP stages) pull each request
    /// from this worker.
    pub need_send: usize,
}

fn plan_message(p: &KvLayout, meta: &XferMetadata) -> Result<MessagePlan, ConnectorError> {
    let d_tp = meta.remote_tp_size as usize;
    let d_rank = meta.remote_tp_rank as usize;
    check_tp_sizes(p.tp_size, d_tp.max(1))?;
    let d_layout = KvLayout::from_metadata(meta)?;
    let serves = target_ranks(p.tp_size, d_tp, p.tp_rank);
    if !serves.contains(&d_rank) {
        return Err(ConnectorError::new(
            ConnectorErrorCode::Layout,
            format!(
                "D tp_rank {d_rank} is not paired with P tp_rank {} (P serves D ranks {serves:?})",
                p.tp_rank
            ),
        ));
    }
    // A decoder stage of another PP split owns only some of this stage's
    // layers: match by name and skip the rest (a stage may share none, and
    // then answers at once with nothing written). A PP-1 decoder has every
    // layer, so every producer layer must be there (vLLM's rule).
    let d_pp = meta.remote_pp_size as usize;
    let pairs = if d_pp > 1 && d_pp != p.pp_size {
        align_stage_regions(&p.regions, &d_layout.regions)?
    } else {
        align_regions(&p.regions, &d_layout.regions)?
    };
    // Layers that share one storage on the decode side are listed as
    // regions with the same base: the storage is written once, through the
    // first of them (whichever producer stage owns that layer; the model is
    // the same, so the bytes are too).
    let mut first_with_base = std::collections::HashMap::new();
    for (j, r) in d_layout.regions.iter().enumerate() {
        first_with_base
            .entry((r.base, r.group_index, r.block_len))
            .or_insert(j);
    }
    let mut kept = Vec::with_capacity(pairs.len());
    let mut plans = Vec::with_capacity(pairs.len());
    for (i, j) in pairs {
        let (pr, dr) = (&p.regions[i], &d_layout.regions[j]);
        if first_with_base.get(&(dr.base, dr.group_index, dr.block_len)) != Some(&j) {
            continue;
        }
        if let Some(plan) = pair_plan(pr, dr, p.heads, p.tp_size, p.tp_rank, d_tp, d_rank)? {
            kept.push((i, j));
            plans.push(plan);
        }
    }
    // Every consumer stage pulls from every producer stage when the PP
    // sizes differ; with equal sizes, stage pulls from stage.
    let stages = if d_pp > 1 && d_pp != p.pp_size {
        d_pp
    } else {
        1
    };
    Ok(MessagePlan {
        d_layout,
        pairs: kept,
        plans,
        need_send: serves.len() * stages,
    })
}
