//! A simulated model whose KV cache is a deterministic function of
//! (layer, position, token, head), so a decoder can check every KV byte it
//! received and derive its output from them: missing or corrupt KV changes
//! the generated text.
//!
//! Geometry: per worker (TP rank of a PP stage), one region per layer of
//! `num_blocks` blocks. A block holds a group's `block_size` token slots of
//! the rank's heads in head-major order (`[head][k|v][slot][head_size]`,
//! one byte per element), so the heads of a TP-2 rank are one contiguous
//! half of a TP-1 block, as vLLM's heterogeneous-TP byte plan needs.
//!
//! Variants, as real models have them:
//! - replicated KV: fewer KV heads than TP ranks; each rank holds one head,
//!   the same head on TP ÷ heads ranks;
//! - MLA (`mla`): one latent per token (`head_size` bytes, no separate K
//!   and V), the same on every rank;
//! - hybrid (`hybrid`): two KV-cache groups, even layers in group 0 with
//!   `block_size`-token blocks and odd layers in group 1 with blocks twice
//!   as long, each group with its own block ids; with four layers or more,
//!   the last layer reuses the KV storage of the layer two before it (as
//!   models with cross-layer KV sharing do).
//! - PP: each stage holds a contiguous share of the layers.
use std::ops::Range;

use crate::connector::worker::{KvCacheSpec, LayerSpec};
use crate::connector::KvHeads;

/// Model and KV-cache geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// Layers (one KV region each).
    pub layers: usize,
    /// KV heads in all (split over TP ranks, or replicated when fewer than
    /// the ranks). Ignored with `mla`.
    pub heads: usize,
    /// Bytes per head per token, for K and again for V (with `mla`, of the
    /// latent).
    pub head_size: usize,
    /// Tokens per block (of group 0).
    pub block_size: usize,
    /// Blocks per region.
    pub num_blocks: usize,
    /// Multi-head latent attention: one latent per token on every rank.
    pub mla: bool,
    /// Two KV-cache groups with different block sizes, and one layer that
    /// shares another's storage.
    pub hybrid: bool,
}

impl Default for ModelSpec {
    fn default() -> Self {
        Self {
            layers: 4,
            heads: 4,
            head_size: 16,
            block_size: 16,
            num_blocks: 4096,
            mla: false,
            hybrid: false,
        }
    }
}

impl ModelSpec {
    /// Checks the geometry for a TP size.
    pub fn validate(&self, tp: usize) -> Result<(), String> {
        if self.layers == 0
            || self.heads == 0
            || self.head_size == 0
            || self.block_size == 0
            || self.num_blocks == 0
        {
            return Err(
                "layers, heads, head size, block size and block count must all be positive".into(),
            );
        }
        if self.hybrid && self.layers < 2 {
            return Err("a hybrid model needs at least two layers".into());
        }
        if tp == 0 {
            return Err("TP must be at least 1".into());
        }
        self.kv_heads()
            .rank_heads(tp, 0, tp)
            .map(|_| ())
            .map_err(|e| e.detail)
    }

    /// The connector's view of how heads spread over TP ranks.
    pub fn kv_heads(&self) -> KvHeads {
        if self.mla {
            KvHeads::Mla
        } else {
            KvHeads::Heads(self.heads)
        }
    }

    /// The heads rank `rank` of TP `tp` holds (validated geometry).
    pub fn rank_heads(&self, tp: usize, rank: usize) -> Range<usize> {
        self.kv_heads().rank_heads(tp, rank, tp).unwrap_or(0..0)
    }

    /// Heads each rank holds.
    pub fn heads_per_rank(&self, tp: usize) -> usize {
        self.rank_heads(tp, 0).len()
    }

    /// Whether rank `rank`'s heads are counted in the digest: the first
    /// rank of each replica group (replicas hold the same bytes).
    pub fn counts_in_digest(&self, tp: usize, rank: usize) -> bool {
        rank == 0 || self.rank_heads(tp, rank) != self.rank_heads(tp, rank - 1)
    }

    /// K and V (2), or one latent (MLA).
    fn parts(&self) -> usize {
        if self.mla {
            1
        } else {
            2
        }
    }

    /// KV-cache groups.
    pub fn groups(&self) -> usize {
        if self.hybrid {
            2
        } else {
            1
        }
    }

    /// The group of `layer`.
    pub fn layer_group(&self, layer: usize) -> usize {
        if self.hybrid {
            layer % 2
        } else {
            0
        }
    }

    /// Tokens per block in `group`.
    pub fn group_block_size(&self, group: usize) -> usize {
        self.block_size << group
    }

    /// The layer whose KV `layer` holds (itself, or the layer whose storage
    /// it shares).
    pub fn source_layer(&self, layer: usize) -> usize {
        if self.hybrid && self.layers >= 4 && layer == self.layers - 1 {
            layer - 2
        } else {
            layer
        }
    }

    /// Payload (and stride) of one block of `group` on a rank of TP `tp`.
    pub fn group_block_len(&self, tp: usize, group: usize) -> usize {
        self.heads_per_rank(tp) * self.parts() * self.group_block_size(group) * self.head_size
    }

    /// Payload (and stride) of one block of group 0 on a rank of TP `tp`.
    pub fn kv_block_len(&self, tp: usize) -> usize {
        self.group_block_len(tp, 0)
    }

    /// The connector's view of one rank's cache (every layer; a PP stage
    /// takes its share).
    pub fn cache_spec(&self, tp: usize) -> KvCacheSpec {
        KvCacheSpec {
            layers: (0..self.layers)
                .map(|l| {
                    let g = self.layer_group(l);
                    let len = self.group_block_len(tp, g) as u64;
                    let src = self.source_layer(l);
                    LayerSpec {
                        name: format!("model.layers.{l}.self_attn.attn"),
                        index: l as i64,
                        group: g as i64,
                        num_blocks: self.num_blocks as u64,
                        block_len: len,
                        kv_block_len: len,
                        shares_with: (src != l).then_some(src),
                    }
                })
                .collect(),
            heads: self.kv_heads(),
            groups: self.groups(),
            other_stage_layers: Vec::new(),
        }
    }

    /// Blocks of group 0 needed for `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        self.group_blocks_for(tokens, 0)
    }

    /// Blocks of `group` needed for `tokens` tokens.
    pub fn group_blocks_for(&self, tokens: usize, group: usize) -> usize {
        tokens.div_ceil(self.group_block_size(group))
    }

    /// Blocks of every group needed for `tokens` tokens.
    pub fn blocks_per_group(&self, tokens: usize) -> Vec<usize> {
        (0..self.groups())
            .map(|g| self.group_blocks_for(tokens, g))
            .collect()
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The K (kv = 0) or V (kv = 1) bytes of one head for one token.
pub fn head_kv(layer: usize, pos: usize, token: u32, head: usize, kv: usize, out: &mut [u8]) {
    let key = splitmix64(
        (layer as u64) << 48
            ^ (pos as u64) << 16
            ^ u64::from(token).wrapping_mul(0x0100_0000_01b3)
            ^ (head as u64) << 8
            ^ kv as u64,
    );
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let v = splitmix64(key ^ i as u64).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

/// Fills `block` (one rank's block of `layer`, `group_block_len` bytes)
/// with the KV of the block's tokens; slots past the end of the prompt are
/// zero.
pub fn fill_block(
    spec: &ModelSpec,
    tp: usize,
    rank: usize,
    layer: usize,
    tokens: &[u32],
    block_index: usize,
    block: &mut [u8],
) {
    let heads = spec.rank_heads(tp, rank);
    let (bs, hs, parts) = (
        spec.group_block_size(spec.layer_group(layer)),
        spec.head_size,
        spec.parts(),
    );
    let src = spec.source_layer(layer);
    block.fill(0);
    for slot in 0..bs {
        let pos = block_index * bs + slot;
        let Some(&tok) = tokens.get(pos) else { break };
        for (hl, h) in heads.clone().enumerate() {
            for kv in 0..parts {
                let off = ((hl * parts + kv) * bs + slot) * hs;
                head_kv(src, pos, tok, h, kv, &mut block[off..off + hs]);
            }
        }
    }
}

/// Checks one received block against the model for positions below
/// `limit`; returns the first wrong (position, head) or None. Also folds
/// every checked head into `digest` when `count` (order-independent, so the
/// digest does not depend on the TP layout; replicas are counted once).
#[allow(clippy::too_many_arguments)]
pub fn check_block(
    spec: &ModelSpec,
    tp: usize,
    rank: usize,
    layer: usize,
    tokens: &[u32],
    block_index: usize,
    limit: usize,
    block: &[u8],
    digest: &mut u64,
) -> Option<(usize, usize)> {
    let heads = spec.rank_heads(tp, rank);
    let count = spec.counts_in_digest(tp, rank);
    let (bs, hs, parts) = (
        spec.group_block_size(spec.layer_group(layer)),
        spec.head_size,
        spec.parts(),
    );
    let src = spec.source_layer(layer);
    let mut want = vec![0u8; hs];
    for slot in 0..bs {
        let pos = block_index * bs + slot;
        if pos >= limit {
            break;
        }
        for (hl, h) in heads.clone().enumerate() {
            for kv in 0..parts {
                let off = ((hl * parts + kv) * bs + slot) * hs;
                let got = &block[off..off + hs];
                head_kv(src, pos, tokens[pos], h, kv, &mut want);
                if got != want.as_slice() {
                    return Some((pos, h));
                }
                if count {
                    *digest = digest.wrapping_add(splitmix64(
                        crate::testkit::fnv1a64(got) ^ (layer as u64) << 40,
                    ));
                }
            }
        }
    }
    None
}

/// The digest of the KV the decoder uses for `tokens` (every position but
/// the last, which the decoder recomputes itself, as vLLM does).
pub fn expected_digest(spec: &ModelSpec, tokens: &[u32]) -> u64 {
    let mut d = 0u64;
    let limit = tokens.len().saturating_sub(1);
    for layer in 0..spec.layers {
        let g = spec.layer_group(layer);
        let mut buf = vec![0u8; spec.group_block_len(1, g)];
        for b in 0..spec.group_blocks_for(limit.max(1), g) {
            fill_block(spec, 1, 0, layer, tokens, b, &mut buf);
            let _ = check_block(spec, 1, 0, layer, tokens, b, limit, &buf, &mut d);
        }
    }
    d
}

/// Byte-level tokenizer: one token per byte.
pub fn tokenize(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// The prompt text a chat request turns into.
pub fn chat_prompt(messages: &[(String, String)]) -> String {
    let mut s = String::new();
    for (role, content) in messages {
        s.push_str(&format!("<|{role}|>{content}\n"));
    }
    s.push_str("<|assistant|>");
    s
}

/// Generated text: `n` characters derived from the KV digest and the last
/// prompt token (which the decoder computes itself).
pub fn generate(digest: u64, last_token: u32, n: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz     ";
    let mut state = splitmix64(digest ^ u64::from(last_token) << 32);
    (0..n)
        .map(|_| {
            state = splitmix64(state);
            ALPHABET[(state % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

/// What a decoder must answer for `prompt` (for clients that check).
pub fn expected_completion(spec: &ModelSpec, prompt: &str, max_tokens: usize) -> String {
    let tokens = tokenize(prompt);
    let last = tokens.last().copied().unwrap_or(0);
    generate(expected_digest(spec, &tokens), last, max_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tp2_rank_blocks_are_halves_of_the_tp1_block() {
        let spec = ModelSpec {
            layers: 1,
            heads: 4,
            head_size: 8,
            block_size: 4,
            num_blocks: 8,
            ..ModelSpec::default()
        };
        let tokens = tokenize("hello world");
        let mut full = vec![0u8; spec.kv_block_len(1)];
        fill_block(&spec, 1, 0, 0, &tokens, 1, &mut full);
        let half = spec.kv_block_len(2);
        for rank in 0..2 {
            let mut part = vec![0u8; half];
            fill_block(&spec, 2, rank, 0, &tokens, 1, &mut part);
            assert_eq!(&full[rank * half..(rank + 1) * half], &part[..]);
        }
    }

    #[test]
    fn digest_detects_corruption_and_ignores_the_last_token() {
        let spec = ModelSpec {
            layers: 2,
            heads: 2,
            head_size: 8,
            block_size: 4,
            num_blocks: 8,
            ..ModelSpec::default()
        };
        let tokens = tokenize("abcdefghij");
        let limit = tokens.len() - 1;
        let mut block = vec![0u8; spec.kv_block_len(1)];
        fill_block(&spec, 1, 0, 1, &tokens, 2, &mut block);
        let mut d = 0;
        assert_eq!(
            check_block(&spec, 1, 0, 1, &tokens, 2, limit, &block, &mut d),
            None
        );
        block[3] ^= 1;
        assert!(check_block(&spec, 1, 0, 1, &tokens, 2, limit, &block, &mut d).is_some());
        assert_eq!(expected_completion(&spec, "abcdefghij", 8).len(), 8);
        assert_ne!(
            expected_completion(&spec, "abcdefghij", 16),
            expected_completion(&spec, "abcdefghik", 16)
        );
    }
}
