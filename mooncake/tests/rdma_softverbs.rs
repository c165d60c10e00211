//! The RDMA transport through softverbs, the software verbs stand-in
//! (vendor/softverbs): the test builds `libmc_softverbs.so` with `make`
//! into Cargo's per-target temporary directory, points `MC_VERBS_LIBRARY`
//! at it and describes four fake NICs with `MC_SOFTVERBS_DEVICES` before
//! the first engine loads it. One `#[test]`, because the environment is
//! process-wide.
mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{first_mismatch, patterned};
use mooncake::{Access, Engine, HostBuffer, LocalMemory, Protocol, TaskStatus};

fn build_softverbs() -> PathBuf {
    let vendor = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../vendor");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("softverbs");
    let status = Command::new("make")
        .arg("-C")
        .arg(&vendor)
        .arg(format!("BUILD={}", out.display()))
        .arg("softverbs")
        .status()
        .expect("run make (needed to build the softverbs stand-in)");
    assert!(status.success(), "make softverbs failed");
    out.join("libmc_softverbs.so")
}

fn rdma_engine(allow: &[&str]) -> Engine {
    Engine::builder()
        .local_host("127.0.0.1")
        .protocol(Protocol::Rdma)
        .device_allow_list(allow)
        .handshake_timeout(Duration::from_secs(5))
        .build()
        .expect("RDMA engine over softverbs")
}

#[test]
fn rdma_over_softverbs() {
    let lib = build_softverbs();
    std::env::set_var("MC_SOFTVERBS_DEVICES", "sv0:roce,sv1:roce,sv2:ib,sv3:roce");

    // A library that cannot be loaded: a clear error, no panic.
    std::env::set_var("MC_VERBS_LIBRARY", "/nonexistent/libibverbs.so.1");
    let err = match Engine::builder()
        .local_host("127.0.0.1")
        .protocol(Protocol::Rdma)
        .build()
    {
        Ok(_) => panic!("RDMA without a verbs library must fail"),
        Err(e) => e,
    };
    assert!(err.to_string().contains("/nonexistent"), "{err}");
    // Auto falls back to TCP.
    let tcp = Engine::builder()
        .local_host("127.0.0.1")
        .protocol(Protocol::Auto)
        .build()
        .unwrap();
    assert!(!tcp.has_rdma());
    drop(tcp);
    std::env::set_var("MC_VERBS_LIBRARY", &lib);

    let target = rdma_engine(&["sv3"]);
    let init = rdma_engine(&["sv0", "sv1"]);
    assert!(init.has_rdma());
    let topo = init.rdma_topology().unwrap();
    assert!(
        topo.contains("\"sv0\"") && topo.contains("priority_matrix"),
        "{topo}"
    );
    assert!(!topo.contains("\"sv3\""), "{topo}");

    let size = 4 << 20;
    let published = target
        .register(patterned(size, 5), "cpu:0", Access::RemoteAccessible)
        .unwrap();
    let mut local = init
        .register(HostBuffer::new(size).unwrap(), "cpu:0", Access::LocalOnly)
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    let base = seg.buffers().unwrap()[0];
    assert_eq!(base.addr, published.addr());
    {
        let mut b = init.batch(1).unwrap();
        b.read(&local, 0, &seg, base.addr, size).unwrap();
        b.submit().unwrap();
        b.wait(None).unwrap();
        assert_eq!(b.status(0).unwrap(), TaskStatus::Completed);
    }
    let got = local.local_slice_mut(None).unwrap();
    assert_eq!(first_mismatch(&got[..size], 5, 0), None);
    let counters = init.rdma_counters().unwrap();
    assert!(
        counters.contains("\"sv0\"") && counters.contains("work_requests"),
        "{counters}"
    );
}
