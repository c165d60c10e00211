//! KV-cache geometries of real models for the `kv_bench` example, a cheap
//! deterministic fill pattern to check received blocks with, and the
//! descriptor lists the producer sends for a request (planned with the
//! connector's own functions, so they can be dumped and replayed).
//!
//! Blocks are head-major (a TP rank's heads are one contiguous slice of a
//! TP-1 block), so the fill pattern is defined on the TP-1 block: byte `j`
//! of rank `k`'s block is byte `k × len + j` of the TP-1 block, and a
//! decoder can check what it received without knowing the prefill TP.
use crate::connector::regions::{
    align_regions, check_tp_sizes, request_block_lists, request_descriptors, select_blocks,
    sender_plan, target_ranks, BlockList, BlockPairs, CopyPlan, Descriptor, KvLayout,
};
use crate::connector::worker::KvCacheSpec;
use crate::connector::ConnectorError;

/// One benchmark geometry: a model's KV cache and the prefill TP size
/// (decode is always TP 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchLayout {
    /// Name used on the command line and in results.
    pub name: &'static str,
    /// Layers.
    pub layers: usize,
    /// Regions per layer: 2 when K and V are separate tensors, else 1.
    pub regions_per_layer: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Bytes of one block of one region at TP 1 (the decode side).
    pub block_bytes: u64,
    /// Prefill TP size (it divides the heads evenly).
    pub prefill_tp: usize,
    /// The geometry in words, for the table header.
    pub description: &'static str,
}

/// Every layout `kv_bench` knows, in `--layout all` order.
pub fn all_layouts() -> Vec<BenchLayout> {
    vec![
        BenchLayout {
            name: "default",
            layers: 8,
            regions_per_layer: 1,
            block_size: 16,
            // 8 heads x (K + V) x 16 tokens x 64 bytes.
            block_bytes: 8 * 2 * 16 * 64,
            prefill_tp: 1,
            description: "8 layers x 8 KV heads x 64 bytes/head, K+V in one region per layer, block 16 tokens",
        },
        BenchLayout {
            name: "llama8b",
            layers: 32,
            regions_per_layer: 2,
            block_size: 16,
            // 8 KV heads x 128 dims x 2 bytes (bf16) x 16 tokens.
            block_bytes: 8 * 128 * 2 * 16,
            prefill_tp: 1,
            description: "Llama-3-8B: 32 layers x 8 KV heads x 128 dims bf16, K and V separate regions, block 16 tokens",
        },
        BenchLayout {
            name: "llama8b-tp2to1",
            layers: 32,
            regions_per_layer: 2,
            block_size: 16,
            block_bytes: 8 * 128 * 2 * 16,
            prefill_tp: 2,
            description: "Llama-3-8B, prefill TP 2 (4 KV heads per rank) -> decode TP 1 (8 KV heads)",
        },
        BenchLayout {
            name: "mla",
            layers: 61,
            regions_per_layer: 1,
            block_size: 64,
            // One latent of 576 values (bf16) per token.
            block_bytes: 576 * 2 * 64,
            prefill_tp: 1,
            description: "MLA (DeepSeek-V3-like): 61 layers x one 576-value bf16 latent per token, block 64 tokens",
        },
        BenchLayout {
            name: "small",
            layers: 24,
            regions_per_layer: 2,
            block_size: 16,
            // 2 KV heads x 64 dims x 2 bytes x 16 tokens.
            block_bytes: 2 * 64 * 2 * 16,
            prefill_tp: 1,
            description: "small: 24 layers x 2 KV heads x 64 dims bf16, K and V separate regions, block 16 tokens",
        },
    ]
}

/// The layouts a `--layout` value names: `all`, a model name (which
/// brings its heterogeneous-TP variants: `llama8b` runs `llama8b` and
/// `llama8b-tp2to1`), or one variant by its exact name; comma-separated.
pub fn select_layouts(arg: &str) -> Result<Vec<BenchLayout>, String> {
    let all = all_layouts();
    let mut out: Vec<BenchLayout> = Vec::new();
    for want in arg.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let picked: Vec<&BenchLayout> = if want == "all" {
            all.iter().collect()
        } else if all.iter().any(|l| l.name == want) {
            all.iter()
                .filter(|l| {
                    l.name == want
                        || l.name
                            .strip_prefix(want)
                            .is_some_and(|r| r.starts_with("-tp"))
                })
                .collect()
        } else {
            let names: Vec<&str> = all.iter().map(|l| l.name).collect();
            return Err(format!(
                "unknown layout {want:?} (known: all, {})",
                names.join(", ")
            ));
        };
        for l in picked {
            if !out.iter().any(|o| o.name == l.name) {
                out.push(l.clone());
            }
        }
    }
    if out.is_empty() {
        return Err("--layout names no layout".into());
    }
    Ok(out)
}

impl BenchLayout {
    /// Regions per worker.
    pub fn regions(&self) -> usize {
        self.layers * self.regions_per_layer
    }

    /// Bytes of one block of one region on a rank of TP `tp`.
    pub fn rank_block_bytes(&self, tp: usize) -> u64 {
        self.block_bytes / tp as u64
    }

    /// Blocks needed for `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// One rank's cache of `num_blocks` blocks per region, TP `tp`. K and V
    /// of one layer are the layer's name listed twice (regions pair by
    /// name and occurrence).
    pub fn cache_spec(&self, tp: usize, num_blocks: u64) -> KvCacheSpec {
        let len = self.rank_block_bytes(tp);
        KvCacheSpec::uniform(
            (0..self.layers)
                .flat_map(|l| {
                    std::iter::repeat_n(
                        format!("model.layers.{l}.self_attn.attn"),
                        self.regions_per_layer,
                    )
                })
                .collect(),
            num_blocks,
            len,
            len,
        )
    }

    /// A rank's layout as the worker describes it, with addresses relative
    /// to the start of its registered buffer (as `WorkerContext` lays it
    /// out).
    pub fn relative_layout(&self, tp: usize, rank: usize, num_blocks: u64) -> KvLayout {
        self.cache_spec(tp, num_blocks)
            .layout(0, (tp, rank), (1, 0))
            .expect("a uniform cache has a layout")
    }

    /// Fills `out` (one block of one region on rank `rank` of TP `tp`)
    /// with the pattern.
    pub fn fill_block(&self, tp: usize, rank: usize, region: usize, block: u64, out: &mut [u8]) {
        let first_word = rank as u64 * self.rank_block_bytes(tp) / 8;
        fill_words(region, block, first_word, out);
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Writes the pattern of TP-1 block `block` of region `region` from word
/// `first_word` on: a per-(region, block) key mixed with the word index,
/// so a block landing in the wrong place or shifted inside its block is
/// caught. Block lengths are multiples of 8 bytes.
pub fn fill_words(region: usize, block: u64, first_word: u64, out: &mut [u8]) {
    let key = splitmix64((region as u64) << 40 ^ block);
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let w = key ^ (first_word + i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        chunk.copy_from_slice(&w.to_le_bytes()[..chunk.len()]);
    }
}

/// The descriptors each prefill rank sends for one request (prefill
/// blocks `p_blocks` to decode blocks `d_blocks`, one KV-cache group), with
/// offsets relative to each side's registered buffer, planned exactly as
/// the producer plans a pull: region pairing, byte plan per pair, block
/// selection, descriptors (runs merged when whole blocks move).
pub fn plan_descriptors(
    layout: &BenchLayout,
    p_num_blocks: u64,
    d_num_blocks: u64,
    p_blocks: &[u64],
    d_blocks: &[u64],
) -> Result<Vec<Vec<Descriptor>>, ConnectorError> {
    plan_with(
        layout,
        p_num_blocks,
        d_num_blocks,
        p_blocks,
        d_blocks,
        request_descriptors,
    )
}

/// The same transfer as [`plan_descriptors`], as block lists per prefill
/// rank (one per KV-cache group): the regions and ids once, for
/// `mooncake::Batch::submit_blocks`.
pub fn plan_block_lists(
    layout: &BenchLayout,
    p_num_blocks: u64,
    d_num_blocks: u64,
    p_blocks: &[u64],
    d_blocks: &[u64],
) -> Result<Vec<Vec<BlockList>>, ConnectorError> {
    plan_with(
        layout,
        p_num_blocks,
        d_num_blocks,
        p_blocks,
        d_blocks,
        request_block_lists,
    )
}

/// What a request's plan is made into: descriptors or block lists.
type Planner<T> = fn(
    &KvLayout,
    &KvLayout,
    &[(usize, usize)],
    &[CopyPlan],
    &[BlockPairs],
    &mut Vec<T>,
) -> Result<(), ConnectorError>;

/// Region pairing and byte plans per prefill rank, made as the producer
/// makes them, handed to `plan` for the request's output.
fn plan_with<T>(
    layout: &BenchLayout,
    p_num_blocks: u64,
    d_num_blocks: u64,
    p_blocks: &[u64],
    d_blocks: &[u64],
    plan: Planner<T>,
) -> Result<Vec<Vec<T>>, ConnectorError> {
    let p_tp = layout.prefill_tp;
    let d_tp = 1;
    check_tp_sizes(p_tp, d_tp)?;
    let d_layout = layout.relative_layout(d_tp, 0, d_num_blocks);
    let mut per_rank = Vec::with_capacity(p_tp);
    for p_rank in 0..p_tp {
        let p_layout = layout.relative_layout(p_tp, p_rank, p_num_blocks);
        let mut out = Vec::new();
        for d_rank in target_ranks(p_tp, d_tp, p_rank) {
            let pairs = align_regions(&p_layout.regions, &d_layout.regions)?;
            let plans = pairs
                .iter()
                .map(|&(i, j)| {
                    sender_plan(
                        &p_layout.regions[i],
                        &d_layout.regions[j],
                        p_tp,
                        p_rank,
                        d_tp,
                        d_rank,
                    )
                })
                .collect::<Result<Vec<_>, _>>()?;
            let blocks = select_blocks(&vec![p_blocks.to_vec()], &vec![d_blocks.to_vec()])?;
            plan(&p_layout, &d_layout, &pairs, &plans, &blocks, &mut out)?;
        }
        per_rank.push(out);
    }
    Ok(per_rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(name: &str) -> BenchLayout {
        all_layouts().into_iter().find(|l| l.name == name).unwrap()
    }

    /// Every piece of every block list lies inside one descriptor at the
    /// same offset on both sides, and the lists move as many bytes as the
    /// descriptors: the same transfer. Every layout, contiguous and
    /// scattered.
    #[test]
    fn block_lists_name_the_same_bytes_as_descriptors() {
        for l in all_layouts() {
            let (p_num, d_num) = (64, 160);
            let p_blocks: Vec<u64> = (0..40).collect();
            let patterns: [Vec<u64>; 2] = [(0..40).collect(), (0..40).map(|b| 2 * b + 1).collect()];
            for d_blocks in patterns {
                let descs = plan_descriptors(&l, p_num, d_num, &p_blocks, &d_blocks).unwrap();
                let lists = plan_block_lists(&l, p_num, d_num, &p_blocks, &d_blocks).unwrap();
                assert_eq!(descs.len(), lists.len());
                for (rank, (ds, ls)) in descs.iter().zip(&lists).enumerate() {
                    let want: u64 = ds.iter().map(|d| d.len).sum();
                    let got: u64 = ls.iter().map(BlockList::bytes).sum();
                    assert_eq!(got, want, "{} rank {rank}", l.name);
                    for list in ls {
                        for r in &list.regions {
                            for (s, t) in list.src_ids.iter().zip(&list.dst_ids) {
                                let (src, dst) =
                                    (r.src + s * r.src_stride, r.dst + t * r.dst_stride);
                                let inside = ds.iter().any(|d| {
                                    src >= d.src
                                        && src + r.len <= d.src + d.len
                                        && dst.wrapping_sub(d.dst) == src - d.src
                                });
                                assert!(
                                    inside,
                                    "{} rank {rank}: piece {src:#x} -> {dst:#x}",
                                    l.name
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn geometries_match_the_models() {
        let l = layout("llama8b");
        assert_eq!((l.regions(), l.block_bytes), (64, 32 * 1024));
        let l = layout("mla");
        assert_eq!((l.regions(), l.block_bytes), (61, 73_728));
        let l = layout("small");
        assert_eq!((l.regions(), l.block_bytes), (48, 4096));
        let l = layout("llama8b-tp2to1");
        assert_eq!(l.rank_block_bytes(2), 16 * 1024);
        let l = layout("default");
        assert_eq!((l.regions(), l.block_bytes), (8, 16 * 1024));
        // K and V of a layer share the layer's name.
        let s = layout("small").cache_spec(1, 4);
        assert_eq!(s.layers[0].name, s.layers[1].name);
        assert_ne!(s.layers[1].name, s.layers[2].name);
    }

    #[test]
    fn layout_selection() {
        let names = |a: &str| -> Vec<&'static str> {
            select_layouts(a).unwrap().iter().map(|l| l.name).collect()
        };
        assert_eq!(names("llama8b"), ["llama8b", "llama8b-tp2to1"]);
        assert_eq!(names("llama8b-tp2to1"), ["llama8b-tp2to1"]);
        assert_eq!(names("mla,small,mla"), ["mla", "small"]);
        assert_eq!(names("all").len(), 5);
        assert!(select_layouts("gpt5").is_err());
    }

    #[test]
    fn tp_slices_concatenate_to_the_tp1_block() {
        let l = layout("llama8b-tp2to1");
        let mut full = vec![0u8; l.block_bytes as usize];
        l.fill_block(1, 0, 5, 9, &mut full);
        let half = l.rank_block_bytes(2) as usize;
        let mut part = vec![0u8; half];
        for rank in 0..2 {
            l.fill_block(2, rank, 5, 9, &mut part);
            assert_eq!(part, full[rank * half..(rank + 1) * half]);
        }
        let mut other = vec![0u8; l.block_bytes as usize];
        l.fill_block(1, 0, 5, 10, &mut other);
        assert_ne!(full, other);
        l.fill_block(1, 0, 6, 9, &mut other);
        assert_ne!(full, other);
    }

    #[test]
    fn descriptor_counts_and_bounds() {
        let nb = 2048u64; // 32k tokens of block 16
        let src: Vec<u64> = (0..nb).collect();
        let scattered: Vec<u64> = (0..nb).map(|b| 2 * b + 1).collect();
        let l = layout("llama8b");
        let d = plan_descriptors(&l, nb, 2 * nb, &src, &scattered).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].len(), 131_072);
        let contiguous = plan_descriptors(&l, nb, 2 * nb, &src, &src).unwrap();
        assert_eq!(contiguous[0].len(), 64); // one run per region
        assert_eq!(contiguous[0][0].len, nb * 32 * 1024);
        let src_bytes = l.regions() as u64 * nb * l.block_bytes;
        let dst_bytes = l.regions() as u64 * 2 * nb * l.block_bytes;
        for x in &d[0] {
            assert!(x.src + x.len <= src_bytes && x.dst + x.len <= dst_bytes);
        }
        // TP 2 -> 1: one descriptor per block, region and rank; rank 1
        // writes the second half of each decode block.
        let t = layout("llama8b-tp2to1");
        let d = plan_descriptors(&t, nb, 2 * nb, &src, &scattered).unwrap();
        assert_eq!((d.len(), d[0].len(), d[1].len()), (2, 131_072, 131_072));
        assert_eq!(d[1][0].dst, l.block_bytes + 16 * 1024);
        assert_eq!(d[1][0].len, 16 * 1024);
        let contiguous = plan_descriptors(&t, nb, nb, &src, &src).unwrap();
        assert_eq!(contiguous[0].len(), 131_072); // partial blocks never merge
                                                  // MLA: 61 regions of 512 blocks (block 64).
        let m = layout("mla");
        let nb = m.blocks_for(32768) as u64;
        let src: Vec<u64> = (0..nb).collect();
        let scattered: Vec<u64> = (0..nb).map(|b| 2 * b + 1).collect();
        let d = plan_descriptors(&m, nb, 2 * nb, &src, &scattered).unwrap();
        assert_eq!(d[0].len(), 61 * 512);
    }
}
