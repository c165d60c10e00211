//! The calls that mirror upstream's remaining API: batch registration,
//! managed buffers, synchronous reads and writes, segment closing, graceful
//! shutdown, NIC load, links, discovery and uninstalling a transport.
mod common;

use common::{engine, first_mismatch, patterned};
use mooncake::{ErrorCode, HostBuffer, LocalMemory};

#[test]
fn managed_buffers_and_synchronous_transfers() {
    let target = engine();
    let init = engine();
    let mut remote = target.alloc_managed(64 * 1024, "*").unwrap();
    remote.fill(0).unwrap();
    let mut local = init.alloc_managed(64 * 1024, "cpu:0").unwrap();
    assert_eq!(local.addr() % 4096, 0);
    assert!(local.to_vec().iter().all(|b| *b == 0));
    let data: Vec<u8> = (0..64 * 1024).map(|i| (i * 13) as u8).collect();
    local.write_at(0, &data).unwrap();

    let seg = init.open_segment(target.segment_name()).unwrap();
    seg.write_sync(&local, 0, remote.addr(), data.len())
        .unwrap();
    assert_eq!(remote.to_vec(), data);

    let mut back = vec![0u8; 100];
    local.fill(0).unwrap();
    seg.read_sync(&local, 10, remote.addr() + 5, 100).unwrap();
    local.read_at(10, &mut back).unwrap();
    assert_eq!(&back[..], &data[5..105]);

    // Out of the local buffer: refused before the engine sees it.
    let e = seg
        .read_sync(&local, 64 * 1024 - 4, remote.addr(), 8)
        .unwrap_err();
    assert!(e.to_string().contains("exceeds"), "{e}");
    // Out of the remote buffer: the transfer fails and says so.
    let e = seg
        .read_sync(&local, 0, remote.addr() + 64 * 1024 - 4, 8)
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::TransferFailed, "{e}");
    assert!(e.to_string().contains("mc_transfer_sync"), "{e}");
    // Memory of another engine, or nothing to move: refused with the cause.
    let e = seg.read_sync(&remote, 0, remote.addr(), 8).unwrap_err();
    assert!(e.to_string().contains("another engine"), "{e}");
    let e = seg.write_sync(&local, 0, remote.addr(), 0).unwrap_err();
    assert!(e.to_string().contains("at least one byte"), "{e}");
    // A zero-length managed buffer is refused.
    assert!(init.alloc_managed(0, "*").is_err());
    // Dropping frees it; the engine outlives it.
    drop(remote);
    seg.close().unwrap();
}

#[test]
fn batch_registration_is_all_or_nothing() {
    let target = engine();
    let init = engine();
    let regs = target
        .register_batch(vec![patterned(8192, 1), patterned(4096, 2)], "*")
        .unwrap();
    assert_eq!(regs.len(), 2);
    let seg = init.open_segment(target.segment_name()).unwrap();
    let bufs = seg.buffers().unwrap();
    assert_eq!(bufs.len(), 2);
    let local = init
        .register(
            HostBuffer::new(4096).unwrap(),
            "*",
            mooncake::Access::LocalOnly,
        )
        .unwrap();
    seg.read_sync(&local, 0, regs[1].addr(), 4096).unwrap();
    assert_eq!(first_mismatch(&local.to_vec(), 2, 0), None);
    // An empty buffer in the list: nothing is registered.
    let e = target
        .register_batch(vec![vec![1u8; 4096], Vec::<u8>::new()], "*")
        .unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
    drop(regs);
    seg.close().unwrap();
    assert!(init
        .open_segment_fresh(target.segment_name())
        .unwrap()
        .buffers()
        .unwrap()
        .is_empty());
}

#[test]
fn diagnostics_and_uninstall_on_a_tcp_engine() {
    let e = engine();
    e.enable_graceful_shutdown();
    assert_eq!(e.nic_load().unwrap(), vec![]);
    assert_eq!(e.transports().unwrap(), (true, false));
    let links = e.show_links(true).unwrap();
    assert!(links.contains("\"transports\":[\"tcp\"]"), "{links}");
    assert!(e.show_links(false).unwrap().contains("=== Local NICs ==="));
    e.discover_topology().unwrap();
    let err = e.uninstall_transport("rdma").unwrap_err();
    assert!(err.to_string().contains("not installed"), "{err}");
    e.uninstall_transport("tcp").unwrap();
    assert_eq!(e.transports().unwrap(), (false, false));
}
