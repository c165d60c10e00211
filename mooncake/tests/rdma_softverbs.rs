//! The RDMA transport through softverbs, the software verbs stand-in
//! (vendor/softverbs): the test builds `libmc_softverbs.so` with `make`
//! into Cargo's per-target temporary directory, points `MC_VERBS_LIBRARY`
//! at it and describes five fake NICs (RoCE and IB, on two NUMA nodes) with
//! `MC_SOFTVERBS_DEVICES` before the first engine loads it. One `#[test]`, because the environment is
//! process-wide.
mod common;
mod softverbs;

use std::time::Duration;

use common::{first_mismatch, patterned};
use mooncake::{
    Access, Engine, ErrorCode, HostBuffer, LinkLayer, Protocol, RdmaCounters, TaskStatus,
};

fn rdma_engine(allow: &[&str]) -> Engine {
    Engine::builder()
        .local_host("127.0.0.1")
        .protocol(Protocol::Rdma)
        .device_allow_list(allow)
        .handshake_timeout(Duration::from_secs(5))
        .build()
        .expect("RDMA engine over softverbs")
}

/// Reads `len` bytes from `target`'s first buffer into a fresh local
/// registration of `init` at `location` (or writes them, for `write`),
/// returning what the initiator's NICs counted for it.
fn transfer(
    init: &Engine,
    target: &Engine,
    len: usize,
    write: bool,
    location: &str,
) -> RdmaCounters {
    let before = init.rdma_counters().unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    let base = seg.buffers().unwrap()[0];
    let mut local = init
        .register(patterned(len, 9), location, Access::LocalOnly)
        .unwrap();
    {
        let mut b = init.batch(1).unwrap();
        if write {
            b.write(&local, 0, &seg, base.addr, len).unwrap();
        } else {
            b.read(&local, 0, &seg, base.addr, len).unwrap();
        }
        b.submit().unwrap();
        b.wait(None).unwrap();
        assert_eq!(b.status(0).unwrap(), TaskStatus::Completed);
    }
    if !write {
        let got = local.local_slice_mut(None).unwrap();
        assert_eq!(first_mismatch(&got[..len], 5, 0), None);
    }
    init.rdma_counters().unwrap().since(&before)
}

#[test]
fn rdma_over_softverbs() {
    let lib = softverbs::build_softverbs();
    std::env::set_var(
        "MC_SOFTVERBS_DEVICES",
        "sv0:roce:numa=0,sv1:roce:numa=1,sv2:ib:numa=0,sv3:roce:numa=1,sv4:ib:numa=1",
    );
    std::env::remove_var("MC_FORCE_TCP");
    std::env::remove_var("MC_FORCE_HCA");

    library_load_failures_and_protocol_choice(&lib);

    let target = rdma_engine(&["sv3"]);
    let init = rdma_engine(&["sv0", "sv1"]);
    assert!(init.has_rdma());
    typed_topology_lists_the_allowed_nics(&init);
    mixed_roce_and_ib_host();
    roce_reads_go_out_on_the_preferred_nic(&init, &target);
    ib_write_is_counted_on_the_ib_nic();
}

/// A verbs library that cannot be loaded, then `lib` (softverbs): what
/// `Protocol::Rdma` and `Protocol::Auto` do, with MC_FORCE_HCA and
/// MC_FORCE_TCP. Leaves MC_VERBS_LIBRARY at `lib`.
fn library_load_failures_and_protocol_choice(lib: &std::path::Path) {
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
    // Auto falls back to TCP and says why; the typed views then fail cleanly.
    let tcp = Engine::builder()
        .local_host("127.0.0.1")
        .protocol(Protocol::Auto)
        .build()
        .unwrap();
    assert!(!tcp.has_rdma());
    let why = tcp.rdma_unavailable_reason().unwrap();
    assert!(why.contains("/nonexistent"), "{why}");
    assert_eq!(
        tcp.rdma_topology().unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
    assert!(tcp.rdma_counters().is_err());
    drop(tcp);
    // MC_FORCE_HCA: Auto must bring RDMA up, so the same failure is an error.
    std::env::set_var("MC_FORCE_HCA", "1");
    assert!(Engine::builder().protocol(Protocol::Auto).build().is_err());
    std::env::remove_var("MC_FORCE_HCA");
    std::env::set_var("MC_VERBS_LIBRARY", lib);
    // MC_FORCE_TCP: Auto does not even try RDMA.
    std::env::set_var("MC_FORCE_TCP", "1");
    let forced = Engine::builder().protocol(Protocol::Auto).build().unwrap();
    assert!(!forced.has_rdma());
    assert_eq!(
        forced.rdma_unavailable_reason(),
        Some("MC_FORCE_TCP is set")
    );
    drop(forced);
    std::env::remove_var("MC_FORCE_TCP");
    let auto = Engine::builder().protocol(Protocol::Auto).build().unwrap();
    assert!(auto.has_rdma() && auto.rdma_unavailable_reason().is_none());
    assert_eq!(auto.rdma_topology().unwrap().devices.len(), 5);
    drop(auto);
}

/// The typed topology of `init` (allowed: sv0, sv1).
fn typed_topology_lists_the_allowed_nics(init: &Engine) {
    // The typed topology: the allowed NICs only, with their real attributes.
    let topo = init.rdma_topology().unwrap();
    let raw = init.rdma_topology_json().unwrap();
    assert_eq!(mooncake::RdmaTopology::from_json(&raw).unwrap(), topo);
    let mut names = topo.device_names();
    names.sort();
    assert_eq!(names, ["sv0", "sv1"], "{raw}");
    for (name, numa) in [("sv0", 0), ("sv1", 1)] {
        let d = topo.device(name).unwrap();
        assert_eq!(d.link_layer, LinkLayer::Roce, "{raw}");
        assert_eq!(d.numa_node, Some(numa), "{raw}");
        assert!(d.usable);
        assert_eq!(d.lid, 0, "RoCE ports have no LID: {raw}");
        assert!(d.gid_bytes().is_some(), "{raw}");
    }
    assert!(topo.device("sv3").is_none());
    // Host memory on node 0 prefers the node-0 NIC, node 1 the node-1 NIC.
    let cpu0 = topo.nics_for("cpu:0");
    assert_eq!(
        (cpu0.preferred.as_slice(), cpu0.available.as_slice()),
        (&["sv0".to_string()][..], &["sv1".to_string()][..]),
        "{raw}"
    );
    let cpu1 = topo.nics_for("cpu:1");
    assert_eq!(cpu1.preferred, ["sv1"], "{raw}");
    assert!(cpu1.contains("sv0") && !cpu1.contains("sv3"));
    // A location the matrix does not know: every NIC.
    let mut any: Vec<String> = topo.nics_for("cuda:7").all().map(String::from).collect();
    any.sort();
    assert_eq!(any, ["sv0", "sv1"]);
}

fn mixed_roce_and_ib_host() {
    // A mixed host: one RoCE and one IB port.
    let mixed = rdma_engine(&["sv0", "sv2"]);
    let mt = mixed.rdma_topology().unwrap();
    let sv2 = mt.device("sv2").unwrap();
    assert_eq!((sv2.link_layer, sv2.numa_node), (LinkLayer::Ib, Some(0)));
    assert_ne!(sv2.lid, 0, "IB ports have a LID");
    assert_eq!(mt.device("sv0").unwrap().link_layer, LinkLayer::Roce);
    let mc = mixed.rdma_counters().unwrap();
    assert_eq!(mc.nic("sv2").unwrap().link_layer, LinkLayer::Ib);
    assert_eq!(mc.total_work_requests(), 0);
    drop(mixed);
}

/// READs from `target` (sv3) into `init` (sv0, sv1) from memory on either
/// NUMA node.
fn roce_reads_go_out_on_the_preferred_nic(init: &Engine, target: &Engine) {
    // A 4 MiB READ over RoCE into memory on NUMA node 0: every slice goes
    // out on sv0, the NIC the priority matrix prefers for cpu:0 (sv1 sits on
    // node 1), and every byte is counted.
    let size = 4 << 20;
    let published = target
        .register(patterned(size, 5), "cpu:0", Access::RemoteAccessible)
        .unwrap();
    let moved = transfer(init, target, size, false, "cpu:0");
    assert_eq!(moved.total_bytes(), size as u64, "{moved:?}");
    assert_eq!(moved.total_errors(), 0);
    let sv0 = moved.nic("sv0").unwrap();
    assert!(
        sv0.work_requests > 1,
        "striped into several slices: {moved:?}"
    );
    assert_eq!(sv0.bytes, size as u64, "{moved:?}");
    assert_eq!(sv0.link_layer, LinkLayer::Roce);
    assert_eq!(moved.nic("sv1").unwrap().bytes, 0, "{moved:?}");
    // The same from memory on node 1: sv1 alone.
    let moved1 = transfer(init, target, size, false, "cpu:1");
    assert_eq!(moved1.nic("sv1").unwrap().bytes, size as u64, "{moved1:?}");
    assert_eq!(moved1.nic("sv0").unwrap().bytes, 0, "{moved1:?}");
    assert_eq!(moved.nic("sv0").unwrap().numa_node, Some(0));
    assert_eq!(init.counters().unwrap().tcp_requests_sent, 0);
    // Counters only grow: a second, odd-sized READ adds exactly its size.
    let again = transfer(init, target, (1 << 20) + 123, false, "cpu:0");
    assert_eq!(again.total_bytes(), (1 << 20) + 123);
    drop(published);
}

fn ib_write_is_counted_on_the_ib_nic() {
    // An IB pair: a WRITE of an odd size, counted on the IB NIC.
    let ib_target = rdma_engine(&["sv4"]);
    let ib_init = rdma_engine(&["sv2"]);
    let len = (3 << 20) + 17;
    let dst = ib_target
        .register(
            HostBuffer::new(len).unwrap(),
            "cpu:1",
            Access::RemoteAccessible,
        )
        .unwrap();
    let moved = transfer(&ib_init, &ib_target, len, true, "cpu:0");
    let sv2 = moved.nic("sv2").unwrap();
    assert_eq!(
        (sv2.bytes, sv2.link_layer),
        (len as u64, LinkLayer::Ib),
        "{moved:?}"
    );
    let mut got = vec![0u8; len];
    dst.read_at(0, &mut got).unwrap();
    assert_eq!(first_mismatch(&got, 9, 0), None);
}
