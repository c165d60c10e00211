//! `MC_BIND_ADDRESS`, `MC_FORCE_TCP` and `MC_FORCE_HCA` reach the builder
//! through the engine's own reader (`mc_get_env_overrides`). One test
//! function: it changes the process environment, which nothing else in
//! this binary reads concurrently.
use mooncake::{Engine, ErrorCode, Protocol};

fn build_with_env_bind() -> mooncake::Result<Engine> {
    Engine::builder()
        .local_host("127.0.0.1")
        .same_host_path(false)
        .build()
}

#[test]
fn env_overrides_reach_the_builder() {
    for v in ["MC_BIND_ADDRESS", "MC_FORCE_TCP", "MC_FORCE_HCA"] {
        std::env::remove_var(v);
    }

    // A bind address the engine cannot use is an error at build time ...
    std::env::set_var("MC_BIND_ADDRESS", "not-an-address.invalid");
    assert!(build_with_env_bind().is_err());
    // ... unless the builder names its own, which wins.
    Engine::builder()
        .local_host("127.0.0.1")
        .bind_address("127.0.0.1")
        .same_host_path(false)
        .build()
        .expect("an explicit bind address ignores MC_BIND_ADDRESS");
    // The engine trims the value; blank means unset (local host).
    std::env::set_var("MC_BIND_ADDRESS", "  127.0.0.1  ");
    build_with_env_bind().expect("a padded MC_BIND_ADDRESS");
    std::env::set_var("MC_BIND_ADDRESS", "   ");
    build_with_env_bind().expect("a blank MC_BIND_ADDRESS");
    // Too long for the C struct: a typed error naming the variable.
    std::env::set_var("MC_BIND_ADDRESS", "1".repeat(300));
    let err = build_with_env_bind().expect_err("an over-long MC_BIND_ADDRESS");
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    assert!(err.to_string().contains("MC_BIND_ADDRESS"), "{err}");
    std::env::remove_var("MC_BIND_ADDRESS");

    // MC_FORCE_TCP (any value, even empty): Auto does not try RDMA.
    std::env::set_var("MC_FORCE_TCP", "");
    let forced = Engine::builder()
        .local_host("127.0.0.1")
        .protocol(Protocol::Auto)
        .build()
        .expect("Auto with MC_FORCE_TCP");
    assert_eq!(
        forced.rdma_unavailable_reason(),
        Some("MC_FORCE_TCP is set")
    );
    drop(forced);
    std::env::remove_var("MC_FORCE_TCP");

    // MC_FORCE_HCA: Auto must bring RDMA up; without a verbs library it cannot.
    std::env::set_var("MC_VERBS_LIBRARY", "/nonexistent/libibverbs.so.1");
    std::env::set_var("MC_FORCE_HCA", "1");
    assert!(Engine::builder()
        .local_host("127.0.0.1")
        .protocol(Protocol::Auto)
        .build()
        .is_err());
    std::env::remove_var("MC_FORCE_HCA");
    let auto = Engine::builder()
        .local_host("127.0.0.1")
        .protocol(Protocol::Auto)
        .build()
        .expect("Auto falls back to TCP");
    assert!(auto.rdma_unavailable_reason().is_some());
}
