//! The listener-limit knobs of the builder reach the engine: an engine
//! built with all of them serves a peer, and bad values are refused.
mod common;

use std::time::Duration;

use mooncake::Engine;

#[test]
fn limit_knobs_build_an_engine_that_serves_peers() {
    let target = Engine::builder()
        .local_host("127.0.0.1")
        .same_host_path(false)
        .tcp_max_server_connections(64)
        .tcp_max_connections_per_source(16)
        .tcp_idle_timeout(Duration::from_millis(500))
        .tcp_pooled_idle_timeout(Duration::from_secs(10))
        .tcp_server_workers(4)
        .handshake_max_connections(32)
        .handshake_max_connections_per_source(8)
        .notify_max_bytes(1 << 20)
        .notify_max_message_bytes(4096)
        .allowed_peer_networks(["127.0.0.1/32", "::1"])
        .build()
        .expect("engine with limits");
    let peer = common::engine();
    let seg = peer
        .open_segment(target.segment_name())
        .expect("an allowed peer opens the segment");
    drop(seg);
}

#[test]
fn bad_limit_values_are_refused_by_name() {
    let err = Engine::builder()
        .local_host("127.0.0.1")
        .allowed_peer_networks(["127.0.0.0/8", "10.0.0.0/40"])
        .build()
        .expect_err("a prefix longer than 32 bits");
    assert!(err.to_string().contains("10.0.0.0/40"), "{err}");
    let err = Engine::builder()
        .local_host("127.0.0.1")
        .tcp_idle_timeout(Duration::ZERO)
        .build()
        .expect_err("a zero idle timeout");
    assert!(err.to_string().contains("tcp_idle_timeout"), "{err}");
}
