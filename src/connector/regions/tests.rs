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
