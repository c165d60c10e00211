//! Checking and planning a pull message before any slot is touched.
use crate::connector::error::{ConnectorError, ConnectorErrorCode};
use crate::connector::protocol::{decode, PullBounds, XferMetadata};
use crate::connector::regions::{
    align_regions, check_tp_sizes, sender_plan, target_ranks, CopyPlan, KvLayout,
};

/// Decodes a pull message, validates every field against this worker's
/// layout (`num_blocks` per region) and plans it. Nothing here trusts a
/// peer value: an Err is the reply, naming the field or the mismatch.
pub fn vet_pull(
    layout: &KvLayout,
    num_blocks: u64,
    payload: &[u8],
) -> Result<(XferMetadata, MessagePlan), ConnectorError> {
    let meta: XferMetadata = decode("MooncakeXferMetadata", payload)?;
    let bounds = PullBounds {
        num_blocks,
        num_groups: layout.num_groups(),
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
    /// How many decoder ranks pull each request from this worker.
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
    if meta.remote_pp_size != 1 {
        return Err(ConnectorError::new(
            ConnectorErrorCode::Layout,
            format!(
                "decode PP size {} is not supported (only 1)",
                meta.remote_pp_size
            ),
        ));
    }
    let pairs = align_regions(&p.regions, &d_layout.regions)?;
    let plans = pairs
        .iter()
        .map(|&(i, j)| {
            sender_plan(
                &p.regions[i],
                &d_layout.regions[j],
                p.tp_size,
                p.tp_rank,
                d_tp,
                d_rank,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(MessagePlan {
        d_layout,
        pairs,
        plans,
        need_send: serves.len(),
    })
}
