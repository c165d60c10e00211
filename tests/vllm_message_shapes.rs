//! Pull messages exactly as vLLM's MooncakeConnector (generation 3) encodes
//! them (`tests/fixtures/vllm_gen3/`, written by
//! `scripts/gen_vllm_fixtures.py`), run through the producer's checks and
//! planning: pipeline parallel, MLA and replicated-KV heterogeneous TP, and
//! hybrid models (several KV-cache groups, layers sharing storage).
//!
//! Where a plan is compared with vLLM's, the expectation comes from a small
//! model of vLLM's sender rules written below (`vllm_*`), from vLLM commit
//! 00f4240ee6458263d76cf51ca7901ce1350bb4d1.

use std::collections::BTreeSet;

use mooncake_connector::connector::error::ConnectorError;
use mooncake_connector::connector::producer::{vet_pull, MessagePlan};
use mooncake_connector::connector::protocol::{self, XferMetadata};
use mooncake_connector::connector::regions::{
    request_descriptors, select_blocks, CopyPlan, Descriptor, KvHeads, KvLayout, KvRegion,
};

/// Decoder region bases in the fixtures: `D_BASE + layer * STRIDE`.
const D_BASE: u64 = 0x7f00_0000_0000;
/// Producer region bases in these tests: `P_BASE + layer * STRIDE`.
const P_BASE: u64 = 0x7e00_0000_0000;
const STRIDE: u64 = 0x10_0000;
/// Blocks per region on the producer.
const NUM_BLOCKS: u64 = 64;

fn from_hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s
        .bytes()
        .filter(|c| !c.is_ascii_whitespace())
        .map(|c| match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => panic!("not a hex digit: {:?}", c as char),
        })
        .collect();
    assert!(digits.len().is_multiple_of(2), "odd number of hex digits");
    digits.chunks(2).map(|p| (p[0] << 4) | p[1]).collect()
}

fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/tests/fixtures/vllm_gen3/{name}.hex",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    from_hex(&text)
}

fn meta(name: &str) -> XferMetadata {
    protocol::decode::<XferMetadata>("MooncakeXferMetadata", &fixture(name)).unwrap()
}

fn layer(i: usize) -> String {
    format!("model.layers.{i}.self_attn.attn")
}

fn region(i: usize, base: u64, block_len: u64, kv_block_len: u64, group: i64) -> KvRegion {
    KvRegion {
        base,
        block_len,
        kv_block_len,
        layer_name: layer(i),
        layer_index: i as i64,
        group_index: group,
    }
}

/// A producer worker owning `layers`, one group-0 region each.
fn producer(
    layers: &[usize],
    block_len: u64,
    kv_block_len: u64,
    (tp_size, tp_rank): (usize, usize),
    (pp_size, pp_rank): (usize, usize),
    heads: KvHeads,
) -> KvLayout {
    KvLayout {
        regions: layers
            .iter()
            .map(|&i| region(i, P_BASE + i as u64 * STRIDE, block_len, kv_block_len, 0))
            .collect(),
        tp_size,
        tp_rank,
        pp_size,
        pp_rank,
        heads,
    }
}

fn vet(layout: &KvLayout, bytes: &[u8], num_groups: usize) -> (XferMetadata, MessagePlan) {
    match vet_pull(layout, NUM_BLOCKS, num_groups, bytes) {
        Ok(ok) => ok,
        Err(e) => panic!("refused: {e}"),
    }
}

fn refuse(layout: &KvLayout, bytes: &[u8], num_groups: usize) -> ConnectorError {
    match vet_pull(layout, NUM_BLOCKS, num_groups, bytes) {
        Ok((_, plan)) => panic!("accepted, pairs {:?}", plan.pairs),
        Err(e) => e,
    }
}

/// (producer layer, decoder layer) of each planned pair.
fn paired_layers(p: &KvLayout, plan: &MessagePlan) -> Vec<(usize, usize)> {
    plan.pairs
        .iter()
        .map(|&(i, j)| {
            (
                p.regions[i].layer_index as usize,
                plan.d_layout.regions[j].layer_index as usize,
            )
        })
        .collect()
}

fn whole(len: u64) -> CopyPlan {
    CopyPlan {
        src_offset: 0,
        dst_offset: 0,
        len,
        whole_blocks: true,
    }
}

/// The descriptors a plan gives for the message's one request when the
/// producer holds `p_blocks`.
fn descriptors(
    p: &KvLayout,
    meta: &XferMetadata,
    plan: &MessagePlan,
    p_blocks: Vec<Vec<u64>>,
) -> Vec<Descriptor> {
    let (_, d_blocks) = &meta.req_blocks["d-1"];
    let blocks = select_blocks(&p_blocks, d_blocks).unwrap();
    let mut out = Vec::new();
    request_descriptors(
        p,
        &plan.d_layout,
        &plan.pairs,
        &plan.plans,
        &blocks,
        &mut out,
    )
    .unwrap();
    out
}

// ---- A model of vLLM's sender rules (mooncake_connector.py) ---------------

/// vLLM `TransferTopology.handshake_target_ranks`: the remote TP ranks a
/// local rank pairs with.
fn vllm_targets(local_tp: usize, remote_tp: usize, rank: usize) -> Vec<usize> {
    if local_tp >= remote_tp {
        vec![rank / (local_tp / remote_tp)]
    } else {
        let k = remote_tp / local_tp;
        (rank * k..(rank + 1) * k).collect()
    }
}

/// vLLM `_compute_sender_transfer_plan` + `_can_coalesce_block_transfers`
/// for one producer region and one consumer region: None where the producer
/// rank sends nothing. `kv_heads` is None for MLA (vLLM passes no head count
/// there); `replicated` is vLLM's `local_replicates_kv_cache` (MLA, or more
/// TP ranks than KV heads).
fn vllm_plan(
    (p_tp, p_rank): (usize, usize),
    (d_tp, d_rank): (usize, usize),
    p: &KvRegion,
    d: &KvRegion,
    replicated: bool,
    kv_heads: Option<usize>,
) -> Option<CopyPlan> {
    let (pk, dk) = (p.kv_block_len, d.kv_block_len);
    let (send, src, dst, len) = if p_tp == d_tp {
        (true, 0, 0, pk)
    } else if let Some(h) = kv_heads.filter(|&h| replicated != (d_tp > h)) {
        // One side replicates heads, the other splits them: move one head.
        let per_rank = (h / p_tp).max(1) as u64;
        let replicas = (p_tp / h).max(1);
        let (ph, dh) = ((p_rank * h / p_tp) as u64, (d_rank * h / d_tp) as u64);
        let per_head = pk / per_rank;
        (
            p_rank % replicas == 0,
            dh.saturating_sub(ph) * per_head,
            ph.saturating_sub(dh) * per_head,
            per_head,
        )
    } else if p_tp > d_tp {
        let k = p_tp / d_tp;
        if replicated {
            (p_rank % k == 0, 0, 0, pk)
        } else {
            (true, 0, (p_rank % k) as u64 * pk, pk)
        }
    } else if replicated {
        (true, 0, 0, pk)
    } else {
        let k = d_tp / p_tp;
        (true, (d_rank % k) as u64 * dk, 0, dk)
    };
    send.then_some(CopyPlan {
        src_offset: src,
        dst_offset: dst,
        len,
        whole_blocks: src == 0 && dst == 0 && len == p.block_len && len == d.block_len,
    })
}

/// Checks the connector's plan against the vLLM model, pair by pair
/// (pairs the model says send nothing must be absent).
fn assert_matches_vllm(
    p: &KvLayout,
    m: &XferMetadata,
    plan: &MessagePlan,
    replicated: bool,
    kv_heads: Option<usize>,
) {
    let d_tp = m.remote_tp_size as usize;
    let d_rank = m.remote_tp_rank as usize;
    let expected: Vec<((usize, usize), CopyPlan)> = (0..p.regions.len())
        .filter_map(|i| {
            let vp = vllm_plan(
                (p.tp_size, p.tp_rank),
                (d_tp, d_rank),
                &p.regions[i],
                &plan.d_layout.regions[i],
                replicated,
                kv_heads,
            )?;
            Some(((i, i), vp))
        })
        .collect();
    let got: Vec<((usize, usize), CopyPlan)> = plan
        .pairs
        .iter()
        .copied()
        .zip(plan.plans.iter().copied())
        .collect();
    assert_eq!(got, expected);
    assert_eq!(
        plan.need_send,
        vllm_targets(p.tp_size, d_tp, p.tp_rank).len()
    );
}

// ---- The wire shape ----------------------------------------------------------

const ALL: [&str; 6] = [
    "pp_d2_stage1",
    "pp_d1_full",
    "mla_d_tp1",
    "mla_d_tp2_rank1",
    "replicated_d_tp2_rank1",
    "hybrid_two_groups",
];

#[test]
fn fixtures_decode_and_reencode_byte_for_byte() {
    for name in ALL {
        let bytes = fixture(name);
        let m = meta(name);
        assert_eq!(m.remote_hostname, "10.0.0.7", "{name}");
        assert_eq!(m.remote_port, 17000, "{name}");
        assert_eq!(m.req_blocks.len(), 1, "{name}");
        assert_eq!(m.req_blocks["d-1"].0, "xfer-1", "{name}");
        let n = m.kv_caches_base_addr.len();
        for (what, len) in [
            ("block_lens", m.block_lens.len()),
            ("kv_block_lens", m.kv_block_lens.len()),
            ("registered_layer_names", m.registered_layer_names.len()),
            ("registered_layer_indices", m.registered_layer_indices.len()),
            ("registered_group_indices", m.registered_group_indices.len()),
        ] {
            assert_eq!(len, n, "{name}: {what}");
        }
        for (k, (&i, name_k)) in m
            .registered_layer_indices
            .iter()
            .zip(&m.registered_layer_names)
            .enumerate()
        {
            assert_eq!(*name_k, layer(i as usize), "{name}: region {k}");
        }
        assert_eq!(m.block_lens, m.kv_block_lens, "{name}");
        // A map keyed by field name: 11 entries with remote_pp_size at its
        // default (left out), 12 with it.
        let entries = if m.remote_pp_size == 1 { 11 } else { 12 };
        assert_eq!(bytes[0], 0x80 | entries, "{name}");
        // msgspec and the connector encode the same fields, in the same
        // order, in the same compact forms.
        let again = protocol::encode(&m);
        assert_eq!(again, bytes, "{name}: re-encoding differs");
        assert_eq!(
            protocol::decode::<XferMetadata>("MooncakeXferMetadata", &again).unwrap(),
            m,
            "{name}"
        );
    }
}

#[test]
fn pp_size_is_on_the_wire_only_when_not_one() {
    let key = b"\xaeremote_pp_size";
    let d2 = fixture("pp_d2_stage1");
    assert!(d2.windows(key.len()).any(|w| w == key));
    let m = meta("pp_d2_stage1");
    assert_eq!(m.remote_pp_size, 2);
    assert_eq!(m.registered_layer_indices, [2, 3]);
    assert_eq!(
        m.kv_caches_base_addr,
        [D_BASE + 2 * STRIDE, D_BASE + 3 * STRIDE]
    );
    assert_eq!(m.req_blocks["d-1"].1, [vec![5, 6, 7]]);

    let d1 = fixture("pp_d1_full");
    assert!(!d1.windows(key.len()).any(|w| w == key));
    let m = meta("pp_d1_full");
    assert_eq!(m.remote_pp_size, 1, "an absent remote_pp_size is 1");
    assert_eq!(m.registered_layer_indices, [0, 1, 2, 3]);
    // Large addresses travel as uint64.
    assert!(d1
        .windows(9)
        .any(|w| w[0] == 0xcf && u64::from_be_bytes(w[1..].try_into().unwrap()) == D_BASE));
}

#[test]
fn group_and_tp_fields_decode() {
    let m = meta("hybrid_two_groups");
    assert_eq!(m.registered_group_indices, [0, 1, 0, 1]);
    assert_eq!(m.block_lens, [4096, 8192, 4096, 8192]);
    assert_eq!(m.kv_caches_base_addr[3], m.kv_caches_base_addr[1]);
    assert_eq!(m.req_blocks["d-1"].1, [vec![10, 11, 12, 13], vec![20, 21]]);
    let m = meta("mla_d_tp2_rank1");
    assert_eq!((m.remote_tp_size, m.remote_tp_rank), (2, 1));
    assert_eq!(m.block_lens, [1152; 3]);
    let m = meta("replicated_d_tp2_rank1");
    assert_eq!((m.remote_tp_size, m.remote_tp_rank), (2, 1));
    assert_eq!(m.req_blocks["d-1"].1, [vec![3]]);
}

// ---- Pipeline parallel ---------------------------------------------------

#[test]
fn pp_equal_sizes_need_the_same_layers() {
    // Producer PP 2 stage 0 (layers 0, 1) against the decoder's stage 1
    // (layers 2, 3): equal PP sizes, so every producer layer must be there.
    let p = producer(&[0, 1], 4096, 4096, (1, 0), (2, 0), KvHeads::Split);
    let e = refuse(&p, &fixture("pp_d2_stage1"), 1);
    assert!(e.detail.contains(&layer(0)), "{e}");
    assert!(e.detail.contains("10.0.0.7:17000"), "{e}");
}

#[test]
fn pp1_producer_serves_each_decoder_stage_its_layers() {
    let p = producer(&[0, 1, 2, 3], 4096, 4096, (1, 0), (1, 0), KvHeads::Split);
    let (m, plan) = vet(&p, &fixture("pp_d2_stage1"), 1);
    assert_eq!(paired_layers(&p, &plan), [(2, 2), (3, 3)]);
    assert_eq!(plan.plans, [whole(4096); 2]);
    // Both decoder stages pull every request from this worker.
    assert_eq!(plan.need_send, 2);
    let d = descriptors(&p, &m, &plan, vec![vec![0, 1, 2]]);
    assert_eq!(
        d,
        [
            Descriptor {
                src: P_BASE + 2 * STRIDE,
                dst: D_BASE + 2 * STRIDE + 5 * 4096,
                len: 3 * 4096,
            },
            Descriptor {
                src: P_BASE + 3 * STRIDE,
                dst: D_BASE + 3 * STRIDE + 5 * 4096,
                len: 3 * 4096,
            },
        ]
    );
}

#[test]
fn pp2_producer_stages_serve_a_pp1_decoder_their_layers() {
    let m = fixture("pp_d1_full");
    let p1 = producer(&[2, 3], 4096, 4096, (1, 0), (2, 1), KvHeads::Split);
    let (_, plan) = vet(&p1, &m, 1);
    assert_eq!(paired_layers(&p1, &plan), [(2, 2), (3, 3)]);
    assert_eq!(plan.pairs, [(0, 2), (1, 3)]);
    assert_eq!(plan.need_send, 1);

    let p0 = producer(&[0, 1], 4096, 4096, (1, 0), (2, 0), KvHeads::Split);
    let (_, plan) = vet(&p0, &m, 1);
    assert_eq!(paired_layers(&p0, &plan), [(0, 0), (1, 1)]);
    assert_eq!(plan.need_send, 1);
}

#[test]
fn a_stage_sharing_no_layer_answers_with_nothing() {
    // Producer PP 4 stage 0 owns layer 0 only; the PP-2 decoder's stage 1
    // still pulls from it (every stage pulls every stage when the sizes
    // differ) and it counts that pull.
    let p = producer(&[0], 4096, 4096, (1, 0), (4, 0), KvHeads::Split);
    let (m, plan) = vet(&p, &fixture("pp_d2_stage1"), 1);
    assert!(plan.pairs.is_empty());
    assert!(plan.plans.is_empty());
    assert_eq!(plan.need_send, 2);
    assert!(descriptors(&p, &m, &plan, vec![vec![0, 1, 2]]).is_empty());
}

// ---- MLA -------------------------------------------------------------------

#[test]
fn mla_tp2_to_tp1_rank0_sends_rank1_does_not() {
    let bytes = fixture("mla_d_tp1");
    let p0 = producer(&[0, 1, 2], 1152, 1152, (2, 0), (1, 0), KvHeads::Mla);
    let (m, plan) = vet(&p0, &bytes, 1);
    assert_eq!(paired_layers(&p0, &plan), [(0, 0), (1, 1), (2, 2)]);
    assert_eq!(plan.plans, [whole(1152); 3]);
    assert_eq!(plan.need_send, 1);
    assert_matches_vllm(&p0, &m, &plan, true, None);
    let d = descriptors(&p0, &m, &plan, vec![vec![7, 8]]);
    assert_eq!(d.len(), 3);
    assert_eq!(
        d[1],
        Descriptor {
            src: P_BASE + STRIDE + 7 * 1152,
            dst: D_BASE + STRIDE + 1152,
            len: 2 * 1152,
        }
    );

    let p1 = producer(&[0, 1, 2], 1152, 1152, (2, 1), (1, 0), KvHeads::Mla);
    let (m, plan) = vet(&p1, &bytes, 1);
    assert!(plan.pairs.is_empty(), "rank 0 sends the replica");
    assert_eq!(plan.need_send, 1);
    assert_matches_vllm(&p1, &m, &plan, true, None);
}

#[test]
fn mla_tp1_to_tp2_sends_whole_blocks_to_each_rank() {
    let p = producer(&[0, 1, 2], 1152, 1152, (1, 0), (1, 0), KvHeads::Mla);
    let (m, plan) = vet(&p, &fixture("mla_d_tp2_rank1"), 1);
    assert_eq!(paired_layers(&p, &plan), [(0, 0), (1, 1), (2, 2)]);
    assert_eq!(plan.plans, [whole(1152); 3]);
    assert_eq!(plan.need_send, 2);
    assert_matches_vllm(&p, &m, &plan, true, None);
}

// ---- Replicated KV heads -------------------------------------------------

#[test]
fn replicated_kv_tp4_to_tp2_rank1() {
    let bytes = fixture("replicated_d_tp2_rank1");
    // 2 KV heads over TP 4: ranks 0, 1 hold head 0, ranks 2, 3 head 1.
    let rank = |r| producer(&[0, 1], 2048, 2048, (4, r), (1, 0), KvHeads::Heads(2));
    assert_eq!(vllm_targets(2, 4, 1), [2, 3], "decoder rank 1 pulls from");

    let p2 = rank(2);
    let (m, plan) = vet(&p2, &bytes, 1);
    assert_eq!(paired_layers(&p2, &plan), [(0, 0), (1, 1)]);
    assert_eq!(plan.plans, [whole(2048); 2]);
    assert_eq!(plan.need_send, 1);
    assert_matches_vllm(&p2, &m, &plan, true, Some(2));
    let d = descriptors(&p2, &m, &plan, vec![vec![9]]);
    assert_eq!(
        d[0],
        Descriptor {
            src: P_BASE + 9 * 2048,
            dst: D_BASE + 3 * 2048,
            len: 2048,
        }
    );

    let p3 = rank(3);
    let (m, plan) = vet(&p3, &bytes, 1);
    assert!(plan.pairs.is_empty(), "rank 2 sends head 1");
    assert_eq!(plan.need_send, 1);
    assert_matches_vllm(&p3, &m, &plan, true, Some(2));

    for r in [0, 1] {
        assert!(!vllm_targets(4, 2, r).contains(&1));
        let e = refuse(&rank(r), &bytes, 1);
        assert!(
            e.detail
                .contains(&format!("D tp_rank 1 is not paired with P tp_rank {r}")),
            "{e}"
        );
    }
}

// ---- Hybrid models ---------------------------------------------------------

/// The producer side of `hybrid_two_groups`: TP 1, layers 0, 2 in group 0
/// (4096-byte blocks), 1, 3 in group 1 (8192); layer 3 a view of layer 1's
/// storage.
fn hybrid_producer() -> KvLayout {
    let lens = [4096, 8192, 4096, 8192];
    let mut regions: Vec<KvRegion> = (0..4)
        .map(|i| {
            region(
                i,
                P_BASE + i as u64 * STRIDE,
                lens[i],
                lens[i],
                (i % 2) as i64,
            )
        })
        .collect();
    regions[3].base = regions[1].base;
    KvLayout {
        regions,
        tp_size: 1,
        tp_rank: 0,
        pp_size: 1,
        pp_rank: 0,
        heads: KvHeads::Split,
    }
}

#[test]
fn hybrid_groups_map_to_their_regions_and_shared_storage_moves_once() {
    let p = hybrid_producer();
    let (m, plan) = vet(&p, &fixture("hybrid_two_groups"), 2);
    // Layer 3 is layer 1's storage on both sides: written once, through 1.
    assert_eq!(plan.pairs, [(0, 0), (1, 1), (2, 2)]);
    assert_eq!(plan.plans, [whole(4096), whole(8192), whole(4096)]);
    assert_eq!(plan.need_send, 1);
    let d = descriptors(&p, &m, &plan, vec![vec![0, 1, 2, 3], vec![0, 1]]);
    assert_eq!(
        d,
        [
            // Group 0: producer blocks 0-3 -> decoder 10-13, 4096 each.
            Descriptor {
                src: P_BASE,
                dst: D_BASE + 10 * 4096,
                len: 4 * 4096,
            },
            // Group 1: producer blocks 0-1 -> decoder 20-21, 8192 each.
            Descriptor {
                src: P_BASE + STRIDE,
                dst: D_BASE + STRIDE + 20 * 8192,
                len: 2 * 8192,
            },
            Descriptor {
                src: P_BASE + 2 * STRIDE,
                dst: D_BASE + 2 * STRIDE + 10 * 4096,
                len: 4 * 4096,
            },
        ]
    );
}

#[test]
fn hybrid_writes_what_vllm_writes() {
    // vLLM's sender does not skip the shared region: it sends layer 3's
    // pair too, the same bytes to the same place. The connector's
    // descriptors are exactly vLLM's, less that repeat.
    let p = hybrid_producer();
    let (m, plan) = vet(&p, &fixture("hybrid_two_groups"), 2);
    let ours: Vec<Descriptor> = descriptors(&p, &m, &plan, vec![vec![0, 1, 2, 3], vec![0, 1]]);
    let vllm_pairs: Vec<(usize, usize)> = (0..4).map(|i| (i, i)).collect();
    let vllm_plans: Vec<CopyPlan> = (0..4)
        .map(|i| {
            vllm_plan(
                (1, 0),
                (1, 0),
                &p.regions[i],
                &plan.d_layout.regions[i],
                false,
                None,
            )
            .unwrap()
        })
        .collect();
    let (_, d_blocks) = &m.req_blocks["d-1"];
    let blocks = select_blocks(&vec![vec![0, 1, 2, 3], vec![0, 1]], d_blocks).unwrap();
    let mut vllm = Vec::new();
    request_descriptors(
        &p,
        &plan.d_layout,
        &vllm_pairs,
        &vllm_plans,
        &blocks,
        &mut vllm,
    )
    .unwrap();
    assert_eq!(vllm.len(), 4);
    assert_eq!(vllm[3], vllm[1], "layer 3 repeats layer 1's copy");
    let key = |d: &Descriptor| (d.src, d.dst, d.len);
    assert_eq!(
        ours.iter().map(key).collect::<BTreeSet<_>>(),
        vllm.iter().map(key).collect::<BTreeSet<_>>()
    );
}

#[test]
fn hybrid_needs_both_groups_on_the_producer() {
    // A producer with one KV-cache group cannot take a two-group request.
    let p = hybrid_producer();
    let e = refuse(&p, &fixture("hybrid_two_groups"), 1);
    assert!(e.detail.contains("req_blocks"), "{e}");
}

// ---- Alignment rules where the connector and vLLM differ -----------------

/// `pp_d2_stage1` with its regions replaced.
fn stage1_with(regions: &[(usize, u64)]) -> Vec<u8> {
    let mut m = meta("pp_d2_stage1");
    m.kv_caches_base_addr = regions.iter().map(|&(_, b)| b).collect();
    m.block_lens = vec![4096; regions.len()];
    m.kv_block_lens = vec![4096; regions.len()];
    m.registered_layer_names = regions.iter().map(|&(i, _)| layer(i)).collect();
    m.registered_layer_indices = regions.iter().map(|&(i, _)| i as i64).collect();
    m.registered_group_indices = vec![0; regions.len()];
    protocol::encode(&m)
}

#[test]
fn pp_partial_match_refuses_a_missing_occurrence_of_a_shared_layer() {
    // The producer registers layer 2 as two regions (occurrences 0 and 1);
    // the decoder stage has only occurrence 0. vLLM's
    // _align_transfer_regions refuses ("no matching consumer occurrence").
    let mut p = producer(&[0, 1, 2, 3], 4096, 4096, (1, 0), (1, 0), KvHeads::Split);
    let mut second = p.regions[2].clone();
    second.base += STRIDE / 2;
    p.regions.insert(3, second);
    let bytes = stage1_with(&[(2, D_BASE + 2 * STRIDE), (3, D_BASE + 3 * STRIDE)]);
    let e = refuse(&p, &bytes, 1);
    assert!(e.detail.contains(&layer(2)), "{e}");
}

#[test]
fn equal_pp_sizes_ignore_decoder_only_regions() {
    // Same PP size (1), and the decoder registers one layer more (4) than
    // the producer (0-3). vLLM aligns producer regions only, so it sends
    // layers 0-3 and leaves layer 4 alone.
    let p = producer(&[0, 1, 2, 3], 4096, 4096, (1, 0), (1, 0), KvHeads::Split);
    let mut m = meta("pp_d1_full");
    m.kv_caches_base_addr.push(D_BASE + 4 * STRIDE);
    m.block_lens.push(4096);
    m.kv_block_lens.push(4096);
    m.registered_layer_names.push(layer(4));
    m.registered_layer_indices.push(4);
    m.registered_group_indices.push(0);
    let (_, plan) = vet(&p, &protocol::encode(&m), 1);
    assert_eq!(paired_layers(&p, &plan), [(0, 0), (1, 1), (2, 2), (3, 3)]);
}

#[test]
fn pp1_decoder_must_have_every_producer_layer() {
    // Producer PP 2 stage 1 (layers 2, 3) and a PP-1 decoder that lacks
    // layer 3: vLLM's allow_partial_layers is false (remote_pp_size is 1),
    // so it refuses, naming layer 3.
    let p = producer(&[2, 3], 4096, 4096, (1, 0), (2, 1), KvHeads::Split);
    let mut m = meta("pp_d1_full");
    m.kv_caches_base_addr.truncate(3);
    m.block_lens.truncate(3);
    m.kv_block_lens.truncate(3);
    m.registered_layer_names.truncate(3);
    m.registered_layer_indices.truncate(3);
    m.registered_group_indices.truncate(3);
    let e = refuse(&p, &protocol::encode(&m), 1);
    assert!(e.detail.contains(&layer(3)), "{e}");
}
