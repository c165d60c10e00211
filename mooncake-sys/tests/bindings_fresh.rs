//! With the `bindgen` feature, the bindings generated from the headers in
//! this build must equal the committed `src/bindings.rs` (CI runs this; run
//! `scripts/regen-bindings.sh` after changing a header).
#![cfg(feature = "bindgen")]

#[test]
fn committed_bindings_match_headers() {
    if mooncake_sys::COMMITTED_BINDINGS != mooncake_sys::GENERATED_BINDINGS {
        let c: Vec<&str> = mooncake_sys::COMMITTED_BINDINGS.lines().collect();
        let g: Vec<&str> = mooncake_sys::GENERATED_BINDINGS.lines().collect();
        let first = c
            .iter()
            .zip(g.iter())
            .position(|(a, b)| a != b)
            .unwrap_or(c.len().min(g.len()));
        panic!(
            "mooncake-sys/src/bindings.rs is stale (first difference at line {}: committed {:?}, \
             generated {:?}); run scripts/regen-bindings.sh",
            first + 1,
            c.get(first),
            g.get(first)
        );
    }
}
