//! A deterministic byte pattern that tests, examples and the peer tools
//! (ours in Rust, the upstream one in Python) all compute the same way, so
//! any process can verify bytes another one wrote.
//!
//! Byte `i` of pattern `seed` is `block(seed)[i % 4093]`, where the block is
//! the little-endian bytes of a splitmix64 stream seeded with `seed`. The
//! prime period makes the pattern depend on the absolute position, so data
//! landing at a wrong offset is caught, and it is cheap to build in Python.

/// Length of the repeating block (a prime).
pub const PATTERN_PERIOD: usize = 4093;

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The repeating block of pattern `seed`.
pub fn pattern_block(seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(PATTERN_PERIOD + 8);
    while out.len() < PATTERN_PERIOD {
        out.extend_from_slice(&splitmix64(&mut state).to_le_bytes());
    }
    out.truncate(PATTERN_PERIOD);
    out
}

/// Fills `buf` with the pattern starting at absolute position `start`.
pub fn fill_pattern(buf: &mut [u8], seed: u64, start: usize) {
    let block = pattern_block(seed);
    for (i, b) in buf.iter_mut().enumerate() {
        *b = block[(start + i) % PATTERN_PERIOD];
    }
}

/// Index of the first byte of `buf` that differs from the pattern at
/// absolute position `start`, if any.
pub fn check_pattern(buf: &[u8], seed: u64, start: usize) -> Option<usize> {
    let block = pattern_block(seed);
    buf.iter()
        .enumerate()
        .position(|(i, b)| *b != block[(start + i) % PATTERN_PERIOD])
}

/// 64-bit FNV-1a, for cheap content digests across processes.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_position_dependent_and_checkable() {
        let mut a = vec![0u8; 10_000];
        fill_pattern(&mut a, 7, 100);
        assert_eq!(check_pattern(&a, 7, 100), None);
        assert_eq!(check_pattern(&a[1..], 7, 101), None);
        assert!(check_pattern(&a, 7, 101).is_some());
        assert!(check_pattern(&a, 8, 100).is_some());
        // Known values, shared with the Python peer (tests/interop).
        assert_eq!(&pattern_block(0)[..4], &[0xaf, 0xcd, 0x1d, 0x7b]);
    }
}
