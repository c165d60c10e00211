//! Unit tests of the builder's environment fallbacks.
use super::*;

#[test]
fn bind_address_falls_back_from_env_to_a_numeric_local_host_to_any() {
    let b = EngineBuilder::default().local_host("10.0.0.7");
    assert_eq!(b.default_bind_address(Some("10.0.0.9".into())), "10.0.0.9");
    assert_eq!(b.default_bind_address(None), "10.0.0.7");
    let named = EngineBuilder::default().local_host("node-7");
    assert_eq!(named.default_bind_address(None), "");
    let explicit = EngineBuilder::default().bind_address("::1");
    assert_eq!(explicit.effective_bind_address().unwrap(), "::1");
}

#[test]
fn force_tcp_wins_over_force_hca() {
    assert_eq!(auto_choice(true, true), AutoChoice::TcpForced);
    assert_eq!(auto_choice(true, false), AutoChoice::TcpForced);
    assert_eq!(auto_choice(false, true), AutoChoice::RdmaRequired);
    assert_eq!(auto_choice(false, false), AutoChoice::RdmaIfUsable);
}
