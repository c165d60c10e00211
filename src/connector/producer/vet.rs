//! Checking and planning a pull message before any slot is touched.
use crate::connector::error::{ConnectorError, ConnectorErrorCode};
use crate::connector::protocol::{decode, PullBounds, XferMetadata};
use crate::connector::regions::{
    align_regions, align_stage_regions, check_tp_sizes, target_ranks, CopyPlan, HeadShare, KvLayout,
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
    vet_stage_pull(layout, num_blocks, num_groups, &[], payload)
}

/// [`vet_pull`] for a worker of one PP stage: `other_stage_layers` are the
/// model's layers that other stages own. A decoder of the same PP size
/// pulls only from this stage, so one that lists such a layer splits the
/// model differently and would never receive it: refused.
pub fn vet_stage_pull(
    layout: &KvLayout,
    num_blocks: u64,
    num_groups: usize,
    other_stage_layers: &[String],
    payload: &[u8],
) -> Result<(XferMetadata, MessagePlan), ConnectorError> {
    let meta: XferMetadata = decode("MooncakeXferMetadata", payload)?;
    let bounds = PullBounds {
        num_blocks,
        num_groups,
    };
    meta.validate(&bounds)?;
    let plan = plan_message(layout, other_stage_layers, &meta).map_err(|e| {
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

fn plan_message(
    p: &KvLayout,
    other_stage_layers: &[String],
    meta: &XferMetadata,
) -> Result<MessagePlan, ConnectorError> {
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
    if d_pp == p.pp_size && p.pp_size > 1 {
        if let Some(r) = d_layout
            .regions
            .iter()
            .find(|r| other_stage_layers.contains(&r.layer_name))
        {
            return Err(ConnectorError::new(
                ConnectorErrorCode::Layout,
                format!(
                    "the decoder's stage has layer {:?}, which another prefill stage owns: \
                     both sides run PP {} but split the layers differently",
                    r.layer_name, p.pp_size
                ),
            ));
        }
    }
    // Layers that share one storage on the decode side are listed as
    // regions with the same base: the storage is written once, through the
    // first of them (whichever producer stage owns that layer; the model is
    // the same, so the bytes are too).
    // Only regions some producer stage writes count: those paired here and
    // those of layers other stages own (the decoder pulls from them too
    // when it reaches this point). A decoder-only region (a draft layer)
    // sharing that storage must not take the write away.
    let mut paired: Vec<usize> = pairs.iter().map(|&(_, j)| j).collect();
    paired.extend(
        d_layout
            .regions
            .iter()
            .enumerate()
            .filter(|(_, r)| other_stage_layers.contains(&r.layer_name))
            .map(|(j, _)| j),
    );
    paired.sort_unstable();
    let mut first_with_base = std::collections::HashMap::new();
    for j in paired {
        let r = &d_layout.regions[j];
        first_with_base
            .entry((r.base, r.group_index, r.block_len))
            .or_insert(j);
    }
    // Which heads move depends on the two ranks only: worked out once per
    // message, at the first pair (a message with no pair checks nothing).
    let mut share: Option<HeadShare> = None;
    let mut kept = Vec::with_capacity(pairs.len());
    let mut plans = Vec::with_capacity(pairs.len());
    for (i, j) in pairs {
        let (pr, dr) = (&p.regions[i], &d_layout.regions[j]);
        if first_with_base.get(&(dr.base, dr.group_index, dr.block_len)) != Some(&j) {
            continue;
        }
        let share = match &share {
            Some(s) => s,
            None => share.insert(HeadShare::new(p.heads, p.tp_size, p.tp_rank, d_tp, d_rank)?),
        };
        if let Some(plan) = share.plan(pr, dr)? {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::connector::protocol::encode;
    use crate::connector::regions::{KvHeads, KvRegion};

    fn region(i: usize, base: u64) -> KvRegion {
        KvRegion {
            base: base + i as u64 * 0x10000,
            block_len: 64,
            kv_block_len: 64,
            layer_name: format!("model.layers.{i}.self_attn.attn"),
            layer_index: i as i64,
            group_index: 0,
        }
    }

    /// A pull from a decoder stage holding `layers`, of PP size `pp`.
    fn pull(layers: &[usize], pp: u64) -> Vec<u8> {
        let mut req_blocks = BTreeMap::new();
        req_blocks.insert("d".to_string(), ("x".to_string(), vec![vec![1, 2]]));
        let mut m = XferMetadata {
            remote_hostname: "127.0.0.1".into(),
            remote_port: 9000,
            remote_tp_size: 1,
            remote_tp_rank: 0,
            req_blocks,
            kv_caches_base_addr: vec![],
            block_lens: vec![],
            kv_block_lens: vec![],
            registered_layer_names: vec![],
            registered_layer_indices: vec![],
            registered_group_indices: vec![],
            remote_pp_size: pp,
        };
        KvLayout {
            regions: layers.iter().map(|&i| region(i, 0x1000_0000)).collect(),
            tp_size: 1,
            tp_rank: 0,
            pp_size: pp as usize,
            pp_rank: 0,
            heads: KvHeads::Split,
        }
        .fill_metadata(&mut m);
        encode(&m)
    }

    fn stage(layers: &[usize], pp: usize) -> KvLayout {
        KvLayout {
            regions: layers.iter().map(|&i| region(i, 0x2000_0000)).collect(),
            tp_size: 1,
            tp_rank: 0,
            pp_size: pp,
            pp_rank: 0,
            heads: KvHeads::Split,
        }
    }

    #[test]
    fn same_pp_size_with_another_split_is_refused() {
        let others: Vec<String> = (2..4)
            .map(|i| format!("model.layers.{i}.self_attn.attn"))
            .collect();
        let p = stage(&[0, 1], 2);
        // The decoder's stage 0 holds layers 0..3: it splits differently.
        let e = vet_stage_pull(&p, 16, 1, &others, &pull(&[0, 1, 2], 2))
            .err()
            .expect("refused");
        assert!(
            e.detail.contains("split the layers differently"),
            "{}",
            e.detail
        );
        // The same split is served.
        let (_, plan) = vet_stage_pull(&p, 16, 1, &others, &pull(&[0, 1], 2)).unwrap();
        assert_eq!(plan.pairs.len(), 2);
        assert_eq!(plan.need_send, 1);
        // A decoder-only layer the model does not have (a draft layer) is
        // left alone.
        let (_, plan) = vet_stage_pull(&p, 16, 1, &others, &pull(&[0, 1, 7], 2)).unwrap();
        assert_eq!(plan.pairs.len(), 2);
        // A PP-4 decoder stage holding layer 1 only: partial, counted 4 times.
        let (_, plan) = vet_stage_pull(&p, 16, 1, &others, &pull(&[1], 4)).unwrap();
        assert_eq!(plan.pairs, [(1, 0)]);
        assert_eq!(plan.need_send, 4);
    }
}
