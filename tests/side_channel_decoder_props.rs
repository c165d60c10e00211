//! Property tests: random and mutated pull messages thrown at the prefill
//! side's decoder, validator and planner never panic, and whatever they
//! accept plans only in-bounds, overflow-free descriptors.
use std::collections::BTreeMap;

use mooncake_connector::connector::producer::vet_pull;
use mooncake_connector::connector::protocol::{encode, XferMetadata};
use mooncake_connector::connector::regions::{
    request_descriptors, select_blocks, KvHeads, KvLayout, KvRegion,
};
use proptest::prelude::*;

const NUM_BLOCKS: u64 = 64;

fn layout(tp_size: usize, tp_rank: usize) -> KvLayout {
    KvLayout {
        regions: (0..2)
            .map(|i| KvRegion {
                base: 0x1000_0000 + i * NUM_BLOCKS * 4096,
                block_len: 4096,
                kv_block_len: 4096,
                layer_name: format!("model.layers.{i}.self_attn.attn"),
                layer_index: i as i64,
                group_index: 0,
            })
            .collect(),
        tp_size,
        tp_rank,
        pp_size: 1,
        pp_rank: 0,
        heads: KvHeads::Split,
    }
}

fn valid(blocks: Vec<Vec<u64>>) -> XferMetadata {
    let mut req_blocks = BTreeMap::new();
    req_blocks.insert("d-1".to_string(), ("xfer-1".to_string(), blocks));
    let mut m = XferMetadata {
        remote_hostname: "127.0.0.1".into(),
        remote_port: 17000,
        remote_tp_size: 0,
        remote_tp_rank: 0,
        req_blocks,
        kv_caches_base_addr: vec![],
        block_lens: vec![],
        kv_block_lens: vec![],
        registered_layer_names: vec![],
        registered_layer_indices: vec![],
        registered_group_indices: vec![],
        remote_pp_size: 1,
    };
    let mut d = layout(1, 0);
    for r in &mut d.regions {
        r.base += 1 << 40;
    }
    d.fill_metadata(&mut m);
    m
}

/// Runs the whole prefill-side path on `payload`; panics only on a bug.
fn exercise(payload: &[u8]) {
    for (tp, rank) in [(1, 0), (2, 1), (4, 3)] {
        let p = layout(tp, rank);
        let Ok((meta, plan)) = vet_pull(&p, NUM_BLOCKS, 1, payload) else {
            continue;
        };
        // Accepted: every request plans into descriptors or a clean error,
        // with P's own blocks standing in for a finished prefill.
        for (_, (_, d_blocks)) in meta.req_blocks.iter() {
            let p_blocks: Vec<Vec<u64>> = d_blocks
                .iter()
                .map(|g| (0..g.len() as u64).collect())
                .collect();
            if let Ok(pairs) = select_blocks(&p_blocks, d_blocks) {
                let mut out = Vec::new();
                if request_descriptors(
                    &p,
                    &plan.d_layout,
                    &plan.pairs,
                    &plan.plans,
                    &pairs,
                    &mut out,
                )
                .is_ok()
                {
                    for d in &out {
                        assert!(d.src.checked_add(d.len).is_some());
                        assert!(d.dst.checked_add(d.len).is_some());
                    }
                }
            }
        }
    }
}

fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for &(pos, val, kind) in edits {
        if bytes.is_empty() {
            bytes.push(val);
            continue;
        }
        let i = pos % bytes.len();
        match kind % 4 {
            0 => bytes[i] = val,
            1 => bytes.insert(i, val),
            2 => {
                bytes.remove(i);
            }
            _ => {
                // Big-number markers make lengths and counts huge.
                bytes[i] = [0xcf, 0xdd, 0xdf, 0xdb][val as usize % 4];
            }
        }
    }
    bytes
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        exercise(&bytes);
    }

    #[test]
    fn mutated_valid_messages_never_panic(
        blocks in proptest::collection::vec(any::<u64>(), 0..8),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6),
    ) {
        exercise(&mutate(encode(&valid(vec![blocks])), &edits));
    }

    #[test]
    fn hostile_field_values_get_an_error_naming_the_field(
        tp_size in prop_oneof![Just(0u64), Just(1 << 34), Just(1 << 63), Just(u64::MAX), 1025u64..],
        port in prop_oneof![Just(0u64), 65536u64..],
        pp_size in prop_oneof![Just(0u64), Just(65u64), Just(1 << 40), Just(u64::MAX), 65u64..],
        id in prop_oneof![Just(u64::MAX), Just(u64::MAX / 4096), (1u64 << 52)..],
    ) {
        let p = layout(1, 0);
        let mut m = valid(vec![vec![1]]);
        m.remote_tp_size = tp_size;
        let e = vet_pull(&p, NUM_BLOCKS, 1, &encode(&m)).err().expect("refused");
        prop_assert!(e.detail.contains("remote_tp_size"), "{}", e.detail);
        let mut m = valid(vec![vec![1]]);
        m.remote_pp_size = pp_size;
        let e = vet_pull(&p, NUM_BLOCKS, 1, &encode(&m)).err().expect("refused");
        prop_assert!(e.detail.contains("remote_pp_size"), "{}", e.detail);
        let mut m = valid(vec![vec![1]]);
        m.remote_port = port;
        let e = vet_pull(&p, NUM_BLOCKS, 1, &encode(&m)).err().expect("refused");
        prop_assert!(e.detail.contains("remote_port"), "{}", e.detail);
        let m = valid(vec![vec![1, id]]);
        let e = vet_pull(&p, NUM_BLOCKS, 1, &encode(&m)).err().expect("refused");
        prop_assert!(e.detail.contains("req_blocks"), "{}", e.detail);
        let m = valid(vec![(0..NUM_BLOCKS + 1).collect()]);
        let e = vet_pull(&p, NUM_BLOCKS, 1, &encode(&m)).err().expect("refused");
        prop_assert!(e.detail.contains("req_blocks"), "{}", e.detail);
    }
}

#[test]
fn a_valid_message_is_accepted() {
    let p = layout(1, 0);
    let (meta, plan) = vet_pull(&p, NUM_BLOCKS, 1, &encode(&valid(vec![vec![1, 2, 3]]))).unwrap();
    assert_eq!(meta.req_blocks.len(), 1);
    assert_eq!(plan.need_send, 1);
}
