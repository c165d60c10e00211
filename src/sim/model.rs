//! A simulated model whose KV cache is a deterministic function of
//! (layer, position, token, head), so a decoder can check every KV byte it
//! received and derive its output from them: missing or corrupt KV changes
//! the generated text.
//!
//! Geometry: per TP rank, one region per layer of `num_blocks` blocks. A
//! block holds `block_size` token slots of the rank's heads in head-major
//! order (`[head][k|v][slot][head_size]`, one byte per element), so the
//! heads of a TP-2 rank are one contiguous half of a TP-1 block, as vLLM's
//! heterogeneous-TP byte plan needs.
use crate::connector::worker::KvCacheSpec;

/// Model and KV-cache geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// Layers (one KV region each).
    pub layers: usize,
    /// KV heads in all (divided among TP ranks).
    pub heads: usize,
    /// Bytes per head per token, for K and again for V.
    pub head_size: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Blocks per region.
    pub num_blocks: usize,
}

impl Default for ModelSpec {
    fn default() -> Self {
        Self {
            layers: 4,
            heads: 4,
            head_size: 16,
            block_size: 16,
            num_blocks: 4096,
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
        if tp == 0 || !self.heads.is_multiple_of(tp) {
            return Err(format!("{} heads cannot be split over TP {tp}", self.heads));
        }
        Ok(())
    }

    /// Heads each rank holds.
    pub fn heads_per_rank(&self, tp: usize) -> usize {
        self.heads / tp
    }

    /// Payload (and stride) of one block on a rank of TP `tp`.
    pub fn kv_block_len(&self, tp: usize) -> usize {
        self.heads_per_rank(tp) * 2 * self.block_size * self.head_size
    }

    /// The connector's view of one rank's cache.
    pub fn cache_spec(&self, tp: usize) -> KvCacheSpec {
        let len = self.kv_block_len(tp) as u64;
        KvCacheSpec {
            layer_names: (0..self.layers)
                .map(|l| format!("model.layers.{l}.self_attn.attn"))
                .collect(),
            num_blocks: self.num_blocks as u64,
            block_len: len,
            kv_block_len: len,
        }
    }

    /// Blocks needed for `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
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

/// Fills `block` (one rank's block of `layer`, `kv_block_len(tp)` bytes)
/// with the KV of `tokens[first..first + block_size]`; slots past the end
/// of the prompt are zero.
pub fn fill_block(
    spec: &ModelSpec,
    tp: usize,
    rank: usize,
    layer: usize,
    tokens: &[u32],
    block_index: usize,
    block: &mut [u8],
) {
    let hpr = spec.heads_per_rank(tp);
    let (bs, hs) = (spec.block_size, spec.head_size);
    block.fill(0);
    for slot in 0..bs {
        let pos = block_index * bs + slot;
        let Some(&tok) = tokens.get(pos) else { break };
        for hl in 0..hpr {
            for kv in 0..2 {
                let off = ((hl * 2 + kv) * bs + slot) * hs;
                head_kv(
                    layer,
                    pos,
                    tok,
                    rank * hpr + hl,
                    kv,
                    &mut block[off..off + hs],
                );
            }
        }
    }
}

/// Checks one received block against the model for positions below
/// `limit`; returns the first wrong (position, head) or None. Also folds
/// every checked head into `digest` (order-independent, so the digest does
/// not depend on the TP layout).
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
    let hpr = spec.heads_per_rank(tp);
    let (bs, hs) = (spec.block_size, spec.head_size);
    let mut want = vec![0u8; hs];
    for slot in 0..bs {
        let pos = block_index * bs + slot;
        if pos >= limit {
            break;
        }
        for hl in 0..hpr {
            for kv in 0..2 {
                let off = ((hl * 2 + kv) * bs + slot) * hs;
                let got = &block[off..off + hs];
                head_kv(layer, pos, tokens[pos], rank * hpr + hl, kv, &mut want);
                if got != want.as_slice() {
                    return Some((pos, rank * hpr + hl));
                }
                *digest = digest.wrapping_add(splitmix64(
                    crate::testkit::fnv1a64(got) ^ (layer as u64) << 40,
                ));
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
    let mut buf = vec![0u8; spec.kv_block_len(1)];
    for layer in 0..spec.layers {
        for b in 0..spec.blocks_for(limit.max(1)) {
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
