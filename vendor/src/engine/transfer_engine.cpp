#include "engine/transfer_engine.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/host_port.h"
#include "common/log.h"
#include "common/socket.h"
#include "common/text.h"
#include "engine/identity.h"
#include "handshake/frame.h"
#include "handshake/handshake_client.h"
#include "handshake/handshake_server.h"
#include "metadata/metadata_directory.h"
#include "gpu/gpu.h"
#include "transport/ipc/ipc_transport.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/samehost/samehost_client.h"
#include "transport/samehost/samehost_server.h"
#include "transport/tcp/tcp_client.h"
#include "transport/tcp/tcp_server.h"
#include "transport/transport.h"

namespace mcrs {

namespace {

// Both of our ports: `fixed` when set, else a free one in the configured
// range; `chosen` is the port listened on. Throws naming `what`.
Fd listen_port(const EngineConfig &cfg, uint16_t fixed, uint16_t &chosen, const char *what) {
    std::string err;
    Fd fd;
    if (fixed != 0) {
        fd = listen_tcp(cfg.bind_address, fixed, cfg.listen_backlog, err);
        chosen = fixed;
    } else {
        fd = listen_tcp_random(cfg.bind_address, cfg.port_min, cfg.port_max, 500, cfg.listen_backlog, chosen, err);
    }
    if (!fd.valid()) throw Error(kErrSocket, std::string(what) + ": " + err);
    return fd;
}

HandshakeClientOptions client_options(const EngineConfig &c) {
    HandshakeClientOptions o;
    o.connect_timeout_ms = c.handshake_connect_timeout_ms;
    o.timeout_ms = c.handshake_timeout_ms;
    o.max_length = c.handshake_max_length;
    return o;
}

}  // namespace

TransferEngine::TransferEngine(EngineConfig cfg)
    : cfg_(std::move(cfg)),
      notifies_(NotifyLimits{cfg_.max_notifications, cfg_.notify_max_bytes,
                             cfg_.notify_max_message_bytes}),
      segments_([this](const std::string &n) { return fetch_descriptor(n); }) {
    cfg_.validate();
    cfg_.gpu_registration_mode = resolve_gpu_registration_mode(cfg_.gpu_registration_mode);
    const bool p2p = cfg_.metadata_conn_string == "P2PHANDSHAKE";
    if (p2p) {
        local_host_ = parse_host_port(cfg_.local_server_name).host;
        if (local_host_.empty()) throw Error(kErrInvalidArgument, "local_server_name has no host part");
    } else {
        open_directory();  // etcd, Redis or HTTP: nothing is contacted yet
    }

    Fd hs = listen_port(cfg_, cfg_.rpc_port, rpc_port_, "handshake listener");
    if (p2p) segment_name_ = join_host_port(local_host_, rpc_port_);
    publish_rpc_meta();  // centralised: before anything runs, so a refusal costs nothing

    HandshakeServerOptions ho;
    ho.timeout_ms = cfg_.handshake_timeout_ms;
    ho.max_length = cfg_.handshake_max_length;
    ho.max_connections = cfg_.handshake_max_connections;
    ho.max_connections_per_source = cfg_.handshake_max_connections_per_source;
    ho.allowed_peers = PeerFilter::parse(cfg_.allowed_peer_networks);
    handshake_ = std::make_unique<HandshakeServer>(
        std::move(hs), ho,
        [this](uint8_t t, const Json &req, Json &reply) { return handle_handshake(t, req, reply); });
    host_id_ = read_host_id();
    try {
        if (cfg_.protocols & kProtoTcp) install_transport("tcp");
        if (cfg_.protocols & kProtoRdma) install_transport("rdma");
        if (cfg_.enable_cuda_ipc && gpu::build_major() != 0) ipc_ = std::make_unique<IpcTransport>(2);
        publish_descriptor();
        handshake_->start();
        start_refresher();
    } catch (...) {
        withdraw_from_directory();
        stop_all();
        throw;
    }
    MC_LOG(Info, "engine " << segment_name_ << " up (handshake " << join_host_port(local_host_, rpc_port_)
                           << ", tcp data port " << tcp_port_
                           << (directory_ ? ", metadata in " + directory_->describe() : std::string()) << ")");
}

TransferEngine::~TransferEngine() {
    if (graceful_.load()) {
        for (auto &b : batches_.all()) b->wait(static_cast<int64_t>(cfg_.tcp_progress_timeout_ms));
    }
    // Peers stop finding this engine before it stops answering.
    withdraw_from_directory();
    stop_all();
}

void TransferEngine::stop_all() {
    stop_refresher();
    if (handshake_) handshake_->stop();
    // Stop initiating first (fails what is queued or in flight), then stop
    // serving peers; after both no thread touches registered memory.
    if (ipc_) ipc_->stop();
    // Before TCP: refused same-host items fall back to the TCP client.
    if (same_host_client_) same_host_client_->stop();
    if (tcp_client_) tcp_client_->stop();
    if (same_host_server_) same_host_server_->stop();
    if (tcp_server_) tcp_server_->stop();
    // Flushes RDMA work in flight (fails it) and deregisters every MR.
    std::atomic_store(&rdma_, std::shared_ptr<rdma::RdmaTransport>());
    batches_.clear();
    registry_.clear();
    release_managed();
}

rdma::RdmaTransportOptions TransferEngine::rdma_options(const std::string &topology_json) {
    rdma::RdmaTransportOptions o;
    o.topology_json = topology_json;
    o.ready_ack_timeout_ms = cfg_.rdma_ready_ack_timeout_ms;
    o.fetch_descriptor = [this](const std::string &n) { return fetch_descriptor(n); };
    o.server_name = segment_name_;
    o.allow = cfg_.device_allow_list;
    o.deny = cfg_.device_deny_list;
    o.gpu_mode = cfg_.gpu_registration_mode;
    HandshakeClientOptions ho = client_options(cfg_);
    o.send_handshake = [this, ho](const std::string &segment, const Json &body, uint32_t timeout_ms) {
        HostPort hp = handshake_address(segment);
        HandshakeClientOptions x = ho;
        if (timeout_ms) x.timeout_ms = timeout_ms;
        return handshake_request(hp.host, hp.port, kHsConnection, body, x);
    };
    return o;
}

void TransferEngine::install_transport(const std::string &proto, const std::string &topology_json) {
    if (proto == "rdma") {
        std::lock_guard<std::mutex> g(install_mu_);
        if (auto cur = rdma()) {
            if (!topology_json.empty() &&
                rdma::Topology::from_json_text(topology_json, kErrInvalidArgument, "installTransport topology")
                        .to_json()
                        .dump() != cur->topology().to_json().dump())
                throw Error(kErrInvalidArgument,
                            "the RDMA transport is already installed with another topology; create "
                            "the engine without the rdma protocol to install it with this one");
            return;
        }
        auto t = std::make_shared<rdma::RdmaTransport>(rdma_options(topology_json));
        // Memory registered before the transport came: register it now.
        for (const auto &r : registry_.snapshot(/*remote_only=*/false))
            t->register_region(r.addr, r.length, r.device, r.remote_accessible, r.location);
        std::atomic_store(&rdma_, std::move(t));
        republish("installing the RDMA transport");
        return;
    }
    if (proto != "tcp")
        throw Error(kErrNotImplemented,
                    "transport '" + proto + "' is not implemented (only 'tcp' and 'rdma' are)");
    std::lock_guard<std::mutex> g(install_mu_);
    if (tcp_installed_.load()) return;
    if (tcp_retired_)
        throw Error(kErrInvalidArgument,
                    "the TCP transport was uninstalled from this engine and cannot be installed on it "
                    "again; create a new engine");
    Fd data = listen_port(cfg_, cfg_.tcp_data_port, tcp_port_, "TCP data listener");
    TcpServerOptions so;
    so.progress_timeout_ms = cfg_.tcp_progress_timeout_ms;
    so.max_connections = cfg_.tcp_max_server_connections;
    so.max_connections_per_source = cfg_.tcp_max_connections_per_source;
    so.idle_timeout_ms = cfg_.tcp_idle_timeout_ms;
    so.pooled_idle_timeout_ms = cfg_.tcp_pooled_idle_timeout_ms;
    so.workers = cfg_.tcp_server_workers;
    so.allowed_peers = PeerFilter::parse(cfg_.allowed_peer_networks);
    tcp_server_ = std::make_unique<TcpServer>(std::move(data), registry_, so);
    tcp_server_->start();
    TcpClientOptions co;
    co.connect_timeout_ms = cfg_.tcp_connect_timeout_ms;
    co.progress_timeout_ms = cfg_.tcp_progress_timeout_ms;
    co.lanes_per_peer = cfg_.tcp_lanes_per_peer;
    co.pipeline_depth = cfg_.tcp_pipeline_depth;
    tcp_client_ = std::make_unique<TcpClient>(co);
    if (cfg_.enable_same_host && !host_id_.empty()) {
        try {
            SameHostServerOptions ho;
            ho.progress_timeout_ms = cfg_.tcp_progress_timeout_ms;
            auto srv = std::make_unique<SameHostServer>(registry_, ho);
            srv->start();
            same_host_server_ = std::move(srv);
            SameHostClientOptions sc;
            sc.connect_timeout_ms = cfg_.tcp_connect_timeout_ms;
            sc.progress_timeout_ms = cfg_.tcp_progress_timeout_ms;
            sc.lanes_per_peer = cfg_.tcp_lanes_per_peer;
            sc.pipeline_depth = cfg_.tcp_pipeline_depth;
            same_host_client_ = std::make_unique<SameHostClient>(
                sc, [this](const SegmentDesc &d, std::vector<TransferItem> &refused) { send_tcp(d, refused); });
        } catch (const Error &e) {
            MC_LOG(Warn, "same-host transport unavailable, using TCP only: " << e.what());
        }
    }
    tcp_installed_.store(true);
    republish("installing the TCP transport");
}

std::shared_ptr<rdma::RdmaTransport> TransferEngine::rdma_or_throw() const {
    auto t = rdma();
    if (!t) throw Error(kErrInvalidArgument, "the RDMA transport is not installed on this engine");
    return t;
}

Json TransferEngine::rdma_topology() const { return rdma_or_throw()->topology_json(); }

Json TransferEngine::rdma_counters() const {
    Json a = Json::array();
    for (const auto &c : rdma_or_throw()->counters()) {
        Json o = Json::object();
        o.set("name", c.name);
        o.set("link_layer", c.link_layer);
        o.set("numa_node", static_cast<int64_t>(c.numa_node));
        o.set("usable", c.usable);
        o.set("work_requests", c.wrs);
        o.set("bytes", c.bytes);
        o.set("errors", c.errors);
        o.set("retries", c.retries);
        a.push(o);
    }
    return a;
}

TransferEngine::Counters TransferEngine::counters() const {
    Counters c{};
    if (tcp_client_) c.tcp_sent = tcp_client_->requests_submitted();
    if (tcp_server_) {
        c.tcp_served = tcp_server_->served_requests();
        c.tcp_rejected = tcp_server_->rejected_requests();
        c.tcp_conns_refused = tcp_server_->refused_connections();
        c.tcp_conns_idle_closed = tcp_server_->idle_closed_connections();
    }
    if (same_host_client_) c.same_host_sent = same_host_client_->requests_sent();
    if (same_host_server_) {
        c.same_host_served = same_host_server_->served();
        c.tcp_rejected += same_host_server_->rejected();
    }
    if (handshake_) c.hs_conns_refused = handshake_->refused_connections();
    c.notifies_refused = notifies_.refused();
    c.notify_bytes_queued = notifies_.queued_bytes();
    if (ipc_) c.ipc_copies = ipc_->copies();
    c.local_copies = local_copies_.load(std::memory_order_relaxed);
    c.tasks_submitted = tasks_submitted_.load(std::memory_order_relaxed);
    c.task_status_reads = task_status_reads_.load(std::memory_order_relaxed);
    return c;
}

SegmentDesc TransferEngine::local_descriptor() const {
    SegmentDesc d;
    d.name = segment_name_;
    const bool tcp = tcp_installed_.load();
    d.protocol = tcp ? "tcp" : "";
    d.tcp_data_host = local_host_;
    d.tcp_data_port = tcp ? tcp_port_ : 0;
    d.tcp_proto_version = 2;
    d.host_id = host_id_;
    d.process_token = process_token();
    if (same_host_server_ && tcp) d.same_host_socket = same_host_server_->socket_name();
    for (const auto &r : registry_.snapshot(/*remote_only=*/true)) {
        BufferDesc b;
        b.name = r.location.empty() ? "*" : r.location;
        b.addr = r.addr;
        b.length = r.length;
        if (!r.ipc_handle.empty()) {
            b.cuda_ipc = r.ipc_handle;
            b.cuda_ipc_offset = r.ipc_offset;
            b.cuda_device = r.device;
        }
        d.buffers.push_back(std::move(b));
    }
    // RDMA: protocol "rdma", devices[], lkey/rkey, priority_matrix; the TCP
    // keys stay so TCP-only peers can still use this segment.
    if (auto t = rdma()) t->fill_descriptor(d);
    return d;
}

bool TransferEngine::handle_handshake(uint8_t type, const Json &req, Json &reply) {
    switch (type) {
        case kHsConnection: {
            if (auto t = rdma()) {
                reply = t->handle_connection(req);
                return true;
            }
            // TCP only: answer like an upstream TCP engine, with an empty
            // endpoint description.
            reply = Json::object();
            reply.set("local_gid", "");
            reply.set("local_lid", 0);
            reply.set("local_nic_path", "");
            reply.set("payload", "");
            reply.set("peer_nic_path", "");
            reply.set("qp_num", Json::array());
            reply.set("reply_msg", "");
            return true;
        }
        case kHsMetadata:
            reply = encode_segment_desc(local_descriptor());
            return true;
        case kHsNotify: {
            Notification n{json_string_or(req, "name", ""), json_string_or(req, "notify_msg", "")};
            NotifyQueue::Push r = notifies_.push(std::move(n));
            const bool ok = r == NotifyQueue::Push::Ok;
            if (ok) batches_.completions().signal();
            uint64_t skipped = 0;
            if (!ok && notify_log_.should_log(skipped))
                MC_LOG(Warn, (r == NotifyQueue::Push::TooLarge
                                  ? "rejecting a notify above notify_max_message_bytes ("
                                  : "notification queue full; rejecting a notify (limit ")
                                 << (r == NotifyQueue::Push::TooLarge ? cfg_.notify_max_message_bytes
                                                                      : cfg_.notify_max_bytes)
                                 << " bytes; " << skipped << " more not logged)");
            reply = Json::object();
            reply.set("name", "");
            reply.set("notify_msg", ok ? "success" : "");
            return true;
        }
        case kHsProbe:
            reply = Json::object();
            reply.set("status", "success");
            return true;
        default: return false;
    }
}

SegmentDesc TransferEngine::fetch_descriptor(const std::string &name) {
    if (directory_) return fetch_from_directory(name);
    HostPort hp = parse_host_port(name);
    Json reply;
    try {
        reply = handshake_request(hp.host, hp.port, kHsMetadata, Json::object(),
                                  client_options(cfg_));
    } catch (const Error &e) {
        throw Error(e.code(), "cannot fetch the descriptor of segment '" + name + "': " + e.what());
    }
    try {
        return decode_segment_desc(reply);
    } catch (const Error &e) {
        throw Error(e.code(), "segment '" + name + "': " + e.what());
    }
}

void TransferEngine::describe_region(RegionInfo &r) const {
    gpu::PointerKind k = gpu::classify(reinterpret_cast<void *>(r.addr));
    if (!k.device) {
        if (r.location.empty() || r.location == "*") r.location = detect_host_location(reinterpret_cast<void *>(r.addr));
        return;
    }
    r.device = k.ordinal;
    r.location = "cuda:" + std::to_string(k.ordinal);  // the pointer's real home
    uint64_t base = 0, size = 0;
    std::string why;
    if (!gpu::allocation_range(reinterpret_cast<void *>(r.addr), base, size, why))
        throw Error(kErrInvalidArgument, "GPU buffer " + hex(r.addr) + ": " + why);
    if (r.addr + r.length > base + size)
        throw Error(kErrInvalidArgument, "GPU range [" + hex(r.addr) + ", " + hex(r.addr + r.length) +
                                             ") runs past the end of its allocation [" + hex(base) + ", " +
                                             hex(base + size) + ")");
    // A CUDA IPC handle opens the whole allocation in the peer, not just
    // this buffer, and the peer's copies never pass our range check. So a
    // handle is published only for a buffer that is its whole allocation;
    // other GPU buffers are served over TCP, range-checked by us.
    if (cfg_.enable_cuda_ipc && r.remote_accessible && (r.addr != base || r.length != size)) {
        MC_LOG(Info, "no CUDA IPC handle for GPU buffer " << hex(r.addr) << "+" << r.length
                         << ": a handle would expose its whole allocation [" << hex(base) << ", "
                         << hex(base + size) << "); register the whole allocation to use CUDA IPC. "
                         << "Peers on this host use TCP for it");
    } else if (cfg_.enable_cuda_ipc && r.remote_accessible) {
        gpu::IpcExport x;
        std::string err;
        if (gpu::ipc_export(reinterpret_cast<void *>(r.addr), x, err)) {
            r.ipc_handle = x.handle_hex;
            r.ipc_offset = x.offset;
        } else {
            MC_LOG(Info, "no CUDA IPC handle for buffer " << hex(r.addr) << " (" << err
                                                          << "); peers on this host will use TCP");
        }
    }
}

void TransferEngine::register_memory(void *addr, size_t len, const std::string &location,
                                     bool remote) {
    RegionInfo r{reinterpret_cast<uint64_t>(addr), len, remote, location};
    describe_region(r);
    registry_.add_batch({r});
    if (auto t = rdma()) {
        try {
            t->register_region(r.addr, r.length, r.device, r.remote_accessible, r.location);
        } catch (...) {
            registry_.remove(r.addr);
            throw;
        }
    }
    if (remote) publish_or_undo({r});
}

void TransferEngine::register_memory_batch(const std::vector<RegionInfo> &regions) {
    std::vector<RegionInfo> rs = regions;
    for (auto &r : rs) describe_region(r);
    registry_.add_batch(rs);
    if (auto t = rdma()) {
        size_t done = 0;
        try {
            for (; done < rs.size(); ++done)
                t->register_region(rs[done].addr, rs[done].length, rs[done].device,
                                   rs[done].remote_accessible, rs[done].location);
        } catch (...) {
            for (size_t i = 0; i < done; ++i) t->deregister_region(rs[i].addr);
            for (auto &r : rs) registry_.remove(r.addr);
            throw;
        }
    }
    for (const auto &r : rs)
        if (r.remote_accessible) {
            publish_or_undo(rs);
            break;
        }
}

void TransferEngine::publish_or_undo(const std::vector<RegionInfo> &added) {
    if (!directory_) return;
    try {
        publish_descriptor();
    } catch (...) {
        // Peers could not learn of the memory: the registration fails as a
        // whole, as upstream's does when its metadata update fails. Same
        // order as unregister_memory: the registry waits for pins first.
        for (const auto &r : added) {
            registry_.remove(r.addr);
            if (auto t = rdma()) t->deregister_region(r.addr);
        }
        // A PUT that timed out may still have landed: say what is true now.
        republish("undoing a registration");
        throw;
    }
}

void TransferEngine::republish(const char *after) {
    if (!directory_) return;
    try {
        publish_descriptor();
    } catch (const Error &e) {
        // Peers keep the previous descriptor; what it names that is gone is
        // rejected by the range check, as for any stale descriptor.
        MC_LOG(Warn, "after " << after << ": " << e.what());
    }
}

void TransferEngine::unregister_memory(void *addr) {
    // The registry waits for pins (transfers in flight) before removing;
    // only then are the MRs released.
    registry_.remove(reinterpret_cast<uint64_t>(addr));
    if (auto t = rdma()) t->deregister_region(reinterpret_cast<uint64_t>(addr));
    republish("unregistering memory");
}

int32_t TransferEngine::open_segment(const std::string &raw, bool no_cache) {
    std::string name = raw;
    while (!name.empty() && name[0] == '/') name.erase(0, 1);
    if (name.empty()) throw Error(kErrInvalidArgument, "segment name is empty");
    // With a store, a cached descriptor is re-read once it is older than
    // metadata_cache_ttl_ms: an engine that restarted under the same name
    // (new ports) is found again without the caller evicting anything.
    return segments_.open(name, no_cache || !cfg_.metadata_cache, directory_ ? cfg_.metadata_cache_ttl_ms : 0);
}

void TransferEngine::close_segment(int32_t id) {
    if (id != kLocalSegment && !segments_.known(id))
        throw Error(kErrInvalidArgument, "unknown segment id " + std::to_string(id));
}

void TransferEngine::remove_cached_segment(const std::string &raw) {
    std::string name = raw;
    while (!name.empty() && name[0] == '/') name.erase(0, 1);
    if (name.empty()) throw Error(kErrInvalidArgument, "segment name is empty");
    segments_.evict(name);
}

std::pair<int, std::string> TransferEngine::sync_segment_cache() {
    return segments_.refresh_all();
}

std::shared_ptr<const SegmentDesc> TransferEngine::segment_desc(int32_t id) const {
    if (id == kLocalSegment) return std::make_shared<const SegmentDesc>(local_descriptor());
    return segments_.get(id);
}

void TransferEngine::probe_segment(int32_t id) {
    auto d = segments_.get(id);
    if (!d) throw Error(kErrInvalidArgument, "unknown segment id " + std::to_string(id));
    HostPort hp = handshake_address(d->name);
    Json r = handshake_request(hp.host, hp.port, kHsProbe, Json::object(), client_options(cfg_));
    if (json_string_or(r, "status", "") != "success")
        throw Error(kErrMetadata, "segment '" + d->name + "' answered the probe without success");
}

std::vector<Notification> TransferEngine::drain_notifications() { return notifies_.drain(); }

void TransferEngine::send_notify(int32_t segment_id, const std::string &name,
                                 const std::string &msg) {
    std::string target_name;
    if (segment_id == kLocalSegment) {
        target_name = segment_name_;
    } else {
        auto d = segments_.get(segment_id);
        if (!d) throw Error(kErrMetadata, "unknown segment id " + std::to_string(segment_id));
        target_name = d->name;  // upstream addresses notifies by the descriptor's name
    }
    HostPort hp = handshake_address(target_name);
    Json body = Json::object();
    body.set("name", name);
    body.set("notify_msg", msg);
    Json r = handshake_request(hp.host, hp.port, kHsNotify, body, client_options(cfg_));
    if (json_string_or(r, "notify_msg", "").empty())
        throw Error(kErrMetadata, "segment '" + target_name + "' refused the notify");
}

}  // namespace mcrs
