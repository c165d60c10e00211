//! Unit tests of the region planning.
use super::*;
use crate::connector::protocol::XferMetadata;

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
        pp_size: 1,
        pp_rank: 0,
        heads: KvHeads::Split,
    };
    let d = KvLayout {
        regions: vec![
            region("l1", 1, 900_000, 64, 64),
            region("l0", 0, 500_000, 64, 64),
        ],
        tp_size: 1,
        tp_rank: 0,
        pp_size: 1,
        pp_rank: 0,
        heads: KvHeads::Split,
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
        pp_size: 1,
        pp_rank: 0,
        heads: KvHeads::Split,
    };
    let dl = KvLayout {
        regions: vec![d],
        tp_size: 1,
        tp_rank: 0,
        pp_size: 1,
        pp_rank: 0,
        heads: KvHeads::Split,
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
    assert!(bad.to_string().contains("per head"), "{bad}");
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

/// (src_offset, dst_offset, len) of producer rank `p` → consumer rank `d`,
/// or None when that rank sends nothing.
fn plan_of(
    heads: KvHeads,
    (p_len, d_len): (u64, u64),
    (p_tp, p): (usize, usize),
    (d_tp, d): (usize, usize),
) -> Option<(u64, u64, u64)> {
    pair_plan(
        &region("l0", 0, 0, p_len, p_len),
        &region("l0", 0, 0, d_len, d_len),
        heads,
        p_tp,
        p,
        d_tp,
        d,
    )
    .unwrap()
    .map(|c| (c.src_offset, c.dst_offset, c.len))
}

#[test]
fn mla_sends_the_whole_latent_from_one_rank_per_consumer() {
    let m = KvHeads::Mla;
    // P TP 2 -> D TP 1: D pulls from both; rank 0 sends, rank 1 has
    // nothing to send (it holds the same latent).
    assert_eq!(plan_of(m, (576, 576), (2, 0), (1, 0)), Some((0, 0, 576)));
    assert_eq!(plan_of(m, (576, 576), (2, 1), (1, 0)), None);
    // P TP 1 -> D TP 2: every D rank gets the whole block.
    assert_eq!(plan_of(m, (576, 576), (1, 0), (2, 0)), Some((0, 0, 576)));
    assert_eq!(plan_of(m, (576, 576), (1, 0), (2, 1)), Some((0, 0, 576)));
    // P TP 4 -> D TP 2: D rank 1 pulls from P ranks 2 and 3; 2 sends.
    assert_eq!(plan_of(m, (576, 576), (4, 2), (2, 1)), Some((0, 0, 576)));
    assert_eq!(plan_of(m, (576, 576), (4, 3), (2, 1)), None);
    // Whole blocks on both sides: runs of blocks merge.
    let c = pair_plan(
        &region("l0", 0, 0, 576, 576),
        &region("l0", 0, 0, 576, 576),
        m,
        2,
        0,
        1,
        0,
    )
    .unwrap()
    .unwrap();
    assert!(c.whole_blocks);
    // Different latent sizes are refused.
    assert!(pair_plan(
        &region("l0", 0, 0, 576, 576),
        &region("l0", 0, 0, 512, 512),
        m,
        1,
        0,
        2,
        0
    )
    .is_err());
}

#[test]
fn replicated_kv_sends_each_head_once() {
    // Two KV heads, 256 bytes per head per block.
    let h = KvHeads::Heads(2);
    // P TP 4 (heads 0,0,1,1) -> D TP 2 (head 0 | head 1).
    assert_eq!(plan_of(h, (256, 256), (4, 0), (2, 0)), Some((0, 0, 256)));
    assert_eq!(plan_of(h, (256, 256), (4, 1), (2, 0)), None);
    assert_eq!(plan_of(h, (256, 256), (4, 2), (2, 1)), Some((0, 0, 256)));
    assert_eq!(plan_of(h, (256, 256), (4, 3), (2, 1)), None);
    // P TP 2 (head 0 | head 1) -> D TP 4 (0,0,1,1): each D rank its head.
    assert_eq!(plan_of(h, (256, 256), (2, 0), (4, 1)), Some((0, 0, 256)));
    assert_eq!(plan_of(h, (256, 256), (2, 1), (4, 2)), Some((0, 0, 256)));
    // P TP 1 (both heads) -> D TP 4: D rank 3 gets head 1, the second half.
    assert_eq!(plan_of(h, (512, 256), (1, 0), (4, 3)), Some((256, 0, 256)));
    // Four heads, P TP 8 (each head twice) -> D TP 2 (two heads each):
    // D rank 1 pulls from P ranks 4..8; 4 and 6 send heads 2 and 3.
    let h4 = KvHeads::Heads(4);
    assert_eq!(plan_of(h4, (128, 256), (8, 4), (2, 1)), Some((0, 0, 128)));
    assert_eq!(plan_of(h4, (128, 256), (8, 5), (2, 1)), None);
    assert_eq!(plan_of(h4, (128, 256), (8, 6), (2, 1)), Some((0, 128, 128)));
    assert_eq!(plan_of(h4, (128, 256), (8, 7), (2, 1)), None);
    // A head count that does not fit the TP size is an error.
    assert!(KvHeads::Heads(3).rank_heads(2, 0, 2).is_err());
    assert!(KvHeads::Heads(2).rank_heads(3, 0, 3).is_err());
}

#[test]
fn split_heads_match_the_plain_plan() {
    // KvHeads::Split gives vLLM's head-sharded offsets.
    assert_eq!(
        plan_of(KvHeads::Split, (256, 512), (2, 1), (1, 0)),
        Some((0, 256, 256))
    );
    assert_eq!(
        plan_of(KvHeads::Split, (512, 256), (1, 0), (2, 1)),
        Some((256, 0, 256))
    );
    // Heads(n) with n a multiple of both TP sizes is the same plan.
    assert_eq!(
        plan_of(KvHeads::Heads(4), (256, 512), (2, 1), (1, 0)),
        Some((0, 256, 256))
    );
}

#[test]
fn stage_alignment_skips_layers_one_side_lacks() {
    let p = [region("l2", 2, 0, 64, 64), region("l3", 3, 0, 64, 64)];
    let d: Vec<KvRegion> = (0..4)
        .map(|i| region(&format!("l{i}"), i, 0, 64, 64))
        .collect();
    assert_eq!(align_stage_regions(&p, &d).unwrap(), [(0, 2), (1, 3)]);
    assert_eq!(align_stage_regions(&d, &p).unwrap(), [(2, 0), (3, 1)]);
    // No shared layer: an empty plan, not an error.
    assert!(align_stage_regions(&p, &d[..2]).unwrap().is_empty());
    // Exact alignment needs every producer layer; decoder-only layers are
    // left alone.
    assert!(align_regions(&d, &p).is_err());
    assert_eq!(align_regions(&p, &d).unwrap(), [(0, 2), (1, 3)]);
    // A missing later occurrence of a layer the decoder has is an error
    // even in stage alignment.
    let twice = [region("l2", 2, 0, 64, 64), region("l2", 2, 0, 64, 64)];
    assert!(align_stage_regions(&twice, &d).is_err());
    // A shared layer with another index or group is still refused.
    let mut bad = p.clone();
    bad[0].group_index = 1;
    assert!(align_stage_regions(&bad, &d).is_err());
}

#[test]
fn pp_layer_ranges_follow_vllm() {
    use crate::connector::pp_layer_range;
    assert_eq!(pp_layer_range(4, 2, 0).unwrap(), 0..2);
    assert_eq!(pp_layer_range(4, 2, 1).unwrap(), 2..4);
    // 5 layers over 2 stages: the extra layer goes to the stage before
    // the last.
    assert_eq!(pp_layer_range(5, 2, 0).unwrap(), 0..3);
    assert_eq!(pp_layer_range(5, 2, 1).unwrap(), 3..5);
    // 7 over 4: shares 2, 2, 2, 1 (the three extras go to stages 2, 1 and
    // 0; the last keeps its share).
    let r: Vec<_> = (0..4).map(|s| pp_layer_range(7, 4, s).unwrap()).collect();
    assert_eq!(r, [0..2, 2..4, 4..6, 6..7]);
    assert!(pp_layer_range(1, 2, 0).is_err());
    assert!(pp_layer_range(4, 2, 2).is_err());
    assert!(pp_layer_range(4, 0, 0).is_err());
}
