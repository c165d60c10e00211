//! Block lists through the safe API (`Batch::submit_blocks`): one task per
//! list, every named block moved byte for byte over TCP and nothing else,
//! task order with queued requests, and refusals that name their cause.
mod common;

use common::{engine, pattern_byte, patterned};
use std::sync::Arc;

use mooncake::{Access, BlockRegion, Error, ErrorCode, Opcode, TaskStatus};

const BLOCK: u64 = 2048;
const BLOCKS: u64 = 32; // per region
const REGIONS: u64 = 4;

fn layers(remote: u64, len: u64) -> Vec<BlockRegion> {
    (0..REGIONS)
        .map(|g| BlockRegion {
            block_len: len,
            ..BlockRegion::packed(g * BLOCKS * BLOCK, remote + g * BLOCKS * BLOCK, BLOCK)
        })
        .collect()
}

#[test]
fn scattered_blocks_of_every_region_move_as_one_task() {
    let target = engine();
    let init = engine();
    let size = (REGIONS * BLOCKS * BLOCK) as usize;
    let published = target
        .register(patterned(size, 7), "*", Access::RemoteAccessible)
        .unwrap();
    let local = init
        .register(vec![0xEEu8; size], "*", Access::LocalOnly)
        .unwrap();
    let peer = init.open_segment(target.segment_name()).unwrap();
    let remote = peer.buffers().unwrap()[0].addr;
    // Local block i <- remote block 31 - 2i, for a block shorter than its stride.
    let local_ids: Vec<u64> = (0..16).collect();
    let remote_ids: Vec<u64> = (0..16).map(|i| BLOCKS - 1 - 2 * i).collect();
    let len = 1500;
    let mut batch = init.batch(4).unwrap();
    let task = batch
        .submit_blocks(
            Opcode::Read,
            &local,
            &peer,
            &layers(remote, len),
            &local_ids,
            &remote_ids,
        )
        .unwrap();
    batch.wait(None).unwrap();
    assert_eq!(task, 0);
    assert_eq!(batch.submitted(), 1);
    assert_eq!(batch.status(task).unwrap(), TaskStatus::Completed);
    assert_eq!(batch.transferred_bytes(task).unwrap(), REGIONS * 16 * len);
    drop(batch);
    let got = local.to_vec();
    for g in 0..REGIONS {
        for b in 0..BLOCKS {
            let at = ((g * BLOCKS + b) * BLOCK) as usize;
            let block = &got[at..at + BLOCK as usize];
            match local_ids.iter().position(|&l| l == b) {
                Some(i) => {
                    let from = ((g * BLOCKS + remote_ids[i]) * BLOCK) as usize;
                    for (k, &v) in block[..len as usize].iter().enumerate() {
                        assert_eq!(
                            v,
                            pattern_byte(7, from + k),
                            "region {g} block {b} byte {k}"
                        );
                    }
                    assert!(block[len as usize..].iter().all(|&v| v == 0xEE));
                }
                None => assert!(block.iter().all(|&v| v == 0xEE), "region {g} block {b}"),
            }
        }
    }
    // And back: WRITE local blocks into other remote blocks.
    let mut batch = init.batch(1).unwrap();
    let t = batch
        .submit_blocks(
            Opcode::Write,
            &local,
            &peer,
            &layers(remote, BLOCK),
            &[20, 21],
            &[0, 2],
        )
        .unwrap();
    batch.wait(None).unwrap();
    assert_eq!(batch.status(t).unwrap(), TaskStatus::Completed);
    drop(batch);
    let remote_now = published.to_vec();
    let b = BLOCK as usize;
    assert_eq!(&remote_now[..b], &got[20 * b..21 * b]);
    assert_eq!(&remote_now[2 * b..3 * b], &got[21 * b..22 * b]);
}

#[test]
fn queued_requests_go_first_and_task_indices_follow_call_order() {
    let target = engine();
    let init = engine();
    let size = (REGIONS * BLOCKS * BLOCK) as usize;
    let _published = target
        .register(patterned(size, 3), "*", Access::RemoteAccessible)
        .unwrap();
    let local = init
        .register(vec![0u8; size], "*", Access::LocalOnly)
        .unwrap();
    let peer = init.open_segment(target.segment_name()).unwrap();
    let remote = peer.buffers().unwrap()[0].addr;
    let mut batch = init.batch(3).unwrap();
    batch.read(&local, 0, &peer, remote, 64).unwrap();
    batch.read(&local, 64, &peer, remote + 64, 64).unwrap();
    let task = batch
        .submit_blocks(
            Opcode::Read,
            &local,
            &peer,
            &layers(remote, BLOCK),
            &[5],
            &[6],
        )
        .unwrap();
    assert_eq!(task, 2);
    assert_eq!(batch.submitted(), 3);
    batch.wait(None).unwrap();
    // Full now: a further list is refused as a request would be.
    let err = batch
        .submit_blocks(
            Opcode::Read,
            &local,
            &peer,
            &layers(remote, BLOCK),
            &[7],
            &[8],
        )
        .unwrap_err();
    assert!(matches!(
        err,
        Error::Engine {
            code: ErrorCode::TooManyRequests,
            ..
        }
    ));
}

#[test]
fn malformed_lists_are_refused_with_their_cause() {
    let target = engine();
    let init = engine();
    let size = (REGIONS * BLOCKS * BLOCK) as usize;
    let _published = target
        .register(vec![0u8; size], "*", Access::RemoteAccessible)
        .unwrap();
    let local = init
        .register(vec![0u8; size], "*", Access::LocalOnly)
        .unwrap();
    let peer = init.open_segment(target.segment_name()).unwrap();
    let remote = peer.buffers().unwrap()[0].addr;
    let r = layers(remote, BLOCK);
    let mut short = r.clone();
    short[1].remote_stride = 100;
    /// What is wrong, the list (regions, local ids, remote ids), and what the error says.
    type Case<'a> = (
        &'a str,
        Vec<BlockRegion>,
        Vec<u64>,
        Vec<u64>,
        Opcode,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "lengths",
            r.clone(),
            vec![1, 2],
            vec![1],
            Opcode::Read,
            "2 local ids but 1 remote ids",
        ),
        (
            "empty",
            r.clone(),
            vec![],
            vec![],
            Opcode::Read,
            "at least one region and one block id",
        ),
        (
            "no regions",
            vec![],
            vec![1],
            vec![1],
            Opcode::Read,
            "at least one region",
        ),
        (
            "local past the memory",
            r.clone(),
            vec![REGIONS * BLOCKS],
            vec![0],
            Opcode::Read,
            "region 0: local range of 2048 bytes at offset 262144",
        ),
        (
            "local overflow",
            r.clone(),
            vec![u64::MAX / 2],
            vec![0],
            Opcode::Read,
            "overflow the address space",
        ),
        (
            "repeated destination",
            r.clone(),
            vec![1, 2, 3],
            vec![4, 4, 5],
            Opcode::Write,
            "remote block id 4 appears twice",
        ),
        (
            "overlapping destination",
            short,
            vec![1, 2],
            vec![3, 4],
            Opcode::Write,
            "region 1: the remote stride 100 is shorter",
        ),
    ];
    for (what, regions, l, rr, op, says) in cases {
        let mut batch = init.batch(2).unwrap();
        let err = batch
            .submit_blocks(op, &local, &peer, &regions, &l, &rr)
            .expect_err(what);
        assert!(
            err.to_string().contains(says),
            "{what}: {err} does not say {says:?}"
        );
        assert_eq!(batch.submitted(), 0, "{what}: the batch changed");
    }
}

#[test]
fn an_async_batch_takes_a_block_list_and_keeps_its_memory() {
    let target = engine();
    let init = engine();
    let size = (REGIONS * BLOCKS * BLOCK) as usize;
    let _published = target
        .register(patterned(size, 9), "*", Access::RemoteAccessible)
        .unwrap();
    let local = Arc::new(
        init.register(vec![0u8; size], "*", Access::LocalOnly)
            .unwrap(),
    );
    let peer = init.open_segment(target.segment_name()).unwrap();
    let remote = peer.buffers().unwrap()[0].addr;
    let mut batch = init.async_batch(2).unwrap();
    batch.read(&local, 0, &peer, remote + 8, 8).unwrap();
    let task = batch
        .submit_blocks(
            Opcode::Read,
            &local,
            &peer,
            &layers(remote, BLOCK),
            &[3, 4],
            &[9, 1],
        )
        .unwrap();
    assert_eq!(task, 1);
    assert_eq!(Arc::strong_count(&local), 2, "the batch holds the memory");
    futures::executor::block_on(batch.run()).unwrap();
    assert_eq!(
        batch.statuses().unwrap().get(1),
        Some(TaskStatus::Completed)
    );
    batch.reset().unwrap();
    let got = local.to_vec();
    let b = BLOCK as usize;
    for g in 0..REGIONS as usize {
        let region = g * BLOCKS as usize * b;
        for (l, r) in [(3, 9), (4, 1)] {
            for k in [0, b - 1] {
                assert_eq!(got[region + l * b + k], pattern_byte(9, region + r * b + k));
            }
        }
    }
}
