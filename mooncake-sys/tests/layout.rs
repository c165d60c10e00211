//! Every struct shared with the engine has the same size and field offsets in
//! Rust as the C++ compiler gave it: the engine describes its own layout
//! (`mc_abi_describe`) and we compare entry by entry, in both directions.
use core::mem::{offset_of, size_of};
use mooncake_sys as sys;
use std::collections::BTreeMap;
use std::ffi::CStr;

fn size_of_field<T, F>(_: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

macro_rules! layout {
    ($map:ident, $t:ident) => {
        $map.insert((stringify!($t).to_string(), String::new()), (0usize, size_of::<sys::$t>()));
    };
    ($map:ident, $t:ident, $($f:ident),+) => {
        layout!($map, $t);
        $(
            $map.insert(
                (stringify!($t).to_string(), stringify!($f).to_string()),
                (offset_of!(sys::$t, $f), size_of_field(|s: &sys::$t| &s.$f)),
            );
        )+
    };
}

// One line per field of every public struct, the Rust side of the
// engine's `mc_abi_describe` table: kept whole so the two read alike.
fn rust_layout() -> BTreeMap<(String, String), (usize, usize)> {
    let mut m = BTreeMap::new();
    layout!(
        m,
        transfer_request,
        opcode,
        source,
        target_id,
        target_offset,
        length
    );
    layout!(m, transfer_status, status, transferred_bytes);
    layout!(m, notify_msg, name, msg);
    layout!(m, buffer_entry, addr, length);
    layout!(
        m,
        nic_load_stat,
        device_name,
        inflight_bytes,
        ewma_bandwidth_bps
    );
    layout!(m, segment_desc);
    layout!(
        m,
        mc_block_region,
        local_base,
        remote_base,
        local_stride,
        remote_stride,
        block_len
    );
    layout!(m, mc_buffer_info, addr, length);
    layout!(m, mc_abi_field, type_name, field_name, offset, size);
    layout!(
        m,
        mc_engine_counters,
        tcp_requests_sent,
        tcp_requests_served,
        tcp_requests_rejected,
        ipc_copies,
        local_copies,
        same_host_requests,
        same_host_served
    );
    layout!(
        m,
        mc_gpu_info,
        build_cuda_major,
        runtime_version,
        driver_version,
        device_count,
        usable
    );
    layout!(m, mc_dmabuf, fd, device, offset, base, size);
    layout!(
        m,
        mc_engine_config,
        struct_size,
        protocols,
        metadata_conn_string,
        local_server_name,
        bind_address,
        device_allow_list,
        device_deny_list,
        rpc_port,
        tcp_data_port,
        port_min,
        port_max,
        gpu_registration_mode,
        handshake_connect_timeout_ms,
        handshake_timeout_ms,
        tcp_connect_timeout_ms,
        tcp_progress_timeout_ms,
        tcp_lanes_per_peer,
        tcp_pipeline_depth,
        tcp_proto_version,
        metadata_cache,
        enable_cuda_ipc,
        handshake_max_length,
        enable_same_host,
        tcp_max_server_connections,
        tcp_max_connections_per_source,
        tcp_idle_timeout_ms,
        tcp_pooled_idle_timeout_ms,
        tcp_server_workers,
        handshake_max_connections,
        handshake_max_connections_per_source,
        notify_max_message_bytes,
        notify_max_bytes,
        allowed_peer_networks,
        advertise_host,
        metadata_cluster_id,
        metadata_timeout_ms,
        metadata_lease_ttl_s,
        redis_username,
        redis_password,
        redis_db
    );
    layout!(
        m,
        mc_engine_limit_counters,
        tcp_connections_refused,
        tcp_connections_idle_closed,
        handshake_connections_refused,
        notifications_refused,
        notification_bytes_queued
    );
    layout!(
        m,
        mc_env_overrides,
        struct_size,
        force_tcp,
        force_hca,
        bind_address
    );
    m
}

fn c_layout() -> BTreeMap<(String, String), (usize, usize)> {
    let mut fields: *const sys::mc_abi_field_t = core::ptr::null();
    // SAFETY: mc_abi_describe writes a pointer to a static array and returns
    // its length; the array lives for the whole program.
    let n = unsafe { sys::mc_abi_describe(&mut fields) };
    assert!(!fields.is_null() && n > 0);
    // SAFETY: `fields` points to `n` initialised entries (see above).
    let slice = unsafe { core::slice::from_raw_parts(fields, n) };
    slice
        .iter()
        .map(|f| {
            // SAFETY: the names are NUL-terminated static strings.
            let t = unsafe { CStr::from_ptr(f.type_name) }
                .to_str()
                .unwrap()
                .to_string();
            // SAFETY: as above.
            let fl = unsafe { CStr::from_ptr(f.field_name) }
                .to_str()
                .unwrap()
                .to_string();
            ((t, fl), (f.offset, f.size))
        })
        .collect()
}

#[test]
fn rust_and_cpp_layouts_agree() {
    let r = rust_layout();
    let c = c_layout();
    for (k, v) in &c {
        assert_eq!(
            r.get(k),
            Some(v),
            "layout of {}.{} (C++: offset/size {:?})",
            k.0,
            k.1,
            v
        );
    }
    for k in r.keys() {
        assert!(
            c.contains_key(k),
            "{}.{} is not described by the engine",
            k.0,
            k.1
        );
    }
}

#[test]
fn upstream_constants() {
    assert_eq!(sys::LOCAL_SEGMENT, 0);
    assert_eq!(sys::INVALID_BATCH, u64::MAX);
    assert_eq!((sys::OPCODE_READ, sys::OPCODE_WRITE), (0, 1));
    assert_eq!(
        [
            sys::STATUS_WAITING,
            sys::STATUS_PENDING,
            sys::STATUS_INVALID,
            sys::STATUS_CANCELED,
            sys::STATUS_COMPLETED,
            sys::STATUS_TIMEOUT,
            sys::STATUS_FAILED
        ],
        [0, 1, 2, 3, 4, 5, 6]
    );
    assert_eq!(sys::ERR_ADDRESS_OVERLAPPED, -7);
    assert_eq!(sys::ERR_NOT_IMPLEMENTED, -303);
    assert_eq!(sys::MC_STATUS_NOT_IMPLEMENTED, 999);
    assert_eq!(size_of::<sys::transfer_request>(), 40);
    assert_eq!(offset_of!(sys::transfer_request, target_offset), 24);
}

#[test]
fn engine_version_matches_header() {
    // SAFETY: returns a static NUL-terminated string.
    let v = unsafe { CStr::from_ptr(sys::mc_engine_version()) };
    let expect = CStr::from_bytes_with_nul(sys::MC_ENGINE_VERSION).unwrap();
    assert_eq!(v, expect);
    assert_eq!(v.to_str().unwrap(), env!("MOONCAKE_ENGINE_VERSION"));
}
