#include "engine/transfer_engine.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "common/error.h"
#include "common/host_port.h"
#include "common/log.h"
#include "common/range.h"
#include "common/socket.h"
#include "common/text.h"
#include "handshake/frame.h"
#include "handshake/handshake_client.h"
#include "handshake/handshake_server.h"
#include "gpu/gpu.h"
#include "transport/ipc/ipc_transport.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/samehost/cma.h"
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

// Identifies this boot of this host; engines that agree on it may use
// same-host paths (CUDA IPC) with each other.
std::string read_host_id() {
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::string id;
    std::getline(f, id);
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    return id.empty() ? std::string() : id + "@" + host;
}

// A random token made once per process: lets CUDA IPC tell its own
// segments from others' without publishing a pid.
const std::string &process_token() {
    static const std::string token = [] {
        unsigned char r[16] = {};
        random_bytes(r, sizeof r);
        static const char digits[] = "0123456789abcdef";
        std::string t;
        for (unsigned char b : r) {
            t.push_back(digits[b >> 4]);
            t.push_back(digits[b & 15]);
        }
        return t;
    }();
    return token;
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
    if (cfg_.metadata_conn_string != "P2PHANDSHAKE")
        throw Error(kErrNotImplemented,
                    "metadata backend '" + cfg_.metadata_conn_string +
                        "' is not supported yet; use P2PHANDSHAKE");
    local_host_ = parse_host_port(cfg_.local_server_name).host;
    if (local_host_.empty()) throw Error(kErrInvalidArgument, "local_server_name has no host part");

    Fd hs = listen_port(cfg_, cfg_.rpc_port, rpc_port_, "handshake listener");
    segment_name_ = join_host_port(local_host_, rpc_port_);

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
    if (cfg_.protocols & kProtoTcp) install_transport("tcp");
    if (cfg_.protocols & kProtoRdma) install_transport("rdma");
    if (cfg_.enable_cuda_ipc && gpu::build_major() != 0) ipc_ = std::make_unique<IpcTransport>(2);
    handshake_->start();
    MC_LOG(Info, "engine " << segment_name_ << " up (tcp data port " << tcp_port_ << ")");
}

TransferEngine::~TransferEngine() {
    if (graceful_.load()) {
        for (auto &b : batches_.all()) b->wait(static_cast<int64_t>(cfg_.tcp_progress_timeout_ms));
    }
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
    rdma_installed_.store(false);
    rdma_.reset();
    batches_.clear();
    registry_.clear();
}

void TransferEngine::install_transport(const std::string &proto, const std::string &topology_json) {
    if (proto == "rdma") {
        std::lock_guard<std::mutex> g(install_mu_);
        if (rdma_installed_.load()) {
            if (!topology_json.empty() &&
                rdma::Topology::from_json_text(topology_json, kErrInvalidArgument, "installTransport topology")
                        .to_json()
                        .dump() != rdma_->topology().to_json().dump())
                throw Error(kErrInvalidArgument,
                            "the RDMA transport is already installed with another topology; create "
                            "the engine without the rdma protocol to install it with this one");
            return;
        }
        rdma::RdmaTransportOptions o;
        o.topology_json = topology_json;
        o.ready_ack_timeout_ms = cfg_.rdma_ready_ack_timeout_ms;
        o.fetch_descriptor = [this](const std::string &n) { return fetch_descriptor(n); };
        o.server_name = segment_name_;
        o.allow = cfg_.device_allow_list;
        o.deny = cfg_.device_deny_list;
        o.gpu_mode = cfg_.gpu_registration_mode;
        HandshakeClientOptions ho = client_options(cfg_);
        o.send_handshake = [ho](const std::string &segment, const Json &body, uint32_t timeout_ms) {
            HostPort hp = parse_host_port(segment);
            HandshakeClientOptions x = ho;
            if (timeout_ms) x.timeout_ms = timeout_ms;
            return handshake_request(hp.host, hp.port, kHsConnection, body, x);
        };
        auto t = std::make_unique<rdma::RdmaTransport>(std::move(o));
        // Memory registered before the transport came: register it now.
        for (const auto &r : registry_.snapshot(/*remote_only=*/false))
            t->register_region(r.addr, r.length, r.device, r.remote_accessible, r.location);
        rdma_ = std::move(t);
        rdma_installed_.store(true);
        return;
    }
    if (proto != "tcp")
        throw Error(kErrNotImplemented,
                    "transport '" + proto + "' is not implemented (only 'tcp' and 'rdma' are)");
    std::lock_guard<std::mutex> g(install_mu_);
    if (tcp_installed_.load()) return;
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
}

rdma::RdmaTransport &TransferEngine::rdma_or_throw() const {
    auto *t = rdma();
    if (!t) throw Error(kErrInvalidArgument, "the RDMA transport is not installed on this engine");
    return *t;
}

Json TransferEngine::rdma_topology() const { return rdma_or_throw().topology_json(); }

Json TransferEngine::rdma_counters() const {
    Json a = Json::array();
    for (const auto &c : rdma_or_throw().counters()) {
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
    d.protocol = tcp_installed_.load() ? "tcp" : "";
    d.tcp_data_host = local_host_;
    d.tcp_data_port = tcp_port_;
    d.tcp_proto_version = 2;
    d.host_id = host_id_;
    d.process_token = process_token();
    if (same_host_server_) d.same_host_socket = same_host_server_->socket_name();
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
    if (auto *t = rdma()) t->fill_descriptor(d);
    return d;
}

bool TransferEngine::handle_handshake(uint8_t type, const Json &req, Json &reply) {
    switch (type) {
        case kHsConnection: {
            if (auto *t = rdma()) {
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
    if (auto *t = rdma()) {
        try {
            t->register_region(r.addr, r.length, r.device, r.remote_accessible, r.location);
        } catch (...) {
            registry_.remove(r.addr);
            throw;
        }
    }
}

void TransferEngine::register_memory_batch(const std::vector<RegionInfo> &regions) {
    std::vector<RegionInfo> rs = regions;
    for (auto &r : rs) describe_region(r);
    registry_.add_batch(rs);
    if (auto *t = rdma()) {
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
}

void TransferEngine::unregister_memory(void *addr) {
    // The registry waits for pins (transfers in flight) before removing;
    // only then are the MRs released.
    registry_.remove(reinterpret_cast<uint64_t>(addr));
    if (auto *t = rdma()) t->deregister_region(reinterpret_cast<uint64_t>(addr));
}

int32_t TransferEngine::open_segment(const std::string &raw, bool no_cache) {
    std::string name = raw;
    while (!name.empty() && name[0] == '/') name.erase(0, 1);
    if (name.empty()) throw Error(kErrInvalidArgument, "segment name is empty");
    return segments_.open(name, no_cache || !cfg_.metadata_cache);
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
    HostPort hp = parse_host_port(d->name);
    Json r = handshake_request(hp.host, hp.port, kHsProbe, Json::object(), client_options(cfg_));
    if (json_string_or(r, "status", "") != "success")
        throw Error(kErrMetadata, "segment '" + d->name + "' answered the probe without success");
}

uint64_t TransferEngine::allocate_batch(size_t capacity) {
    if (capacity == 0) throw Error(kErrInvalidArgument, "batch capacity must be at least 1");
    if (capacity > (1u << 24))
        throw Error(kErrInvalidArgument,
                    "batch capacity " + std::to_string(capacity) + " exceeds the limit of 16777216");
    return batches_.create(capacity)->id();
}

std::shared_ptr<Batch> TransferEngine::batch_or_throw(uint64_t id) const {
    auto b = batches_.find(id);
    if (!b) throw StatusError(kStatusInvalidArgument, "unknown batch id " + std::to_string(id));
    return b;
}

static StatusError too_many_requests(const Batch &batch, size_t n) {
    return StatusError(kStatusTooManyRequests, "batch " + std::to_string(batch.id()) + " holds " +
                                                   std::to_string(batch.submitted()) + " of " +
                                                   std::to_string(batch.capacity()) + " tasks; " +
                                                   std::to_string(n) + " more do not fit");
}

void TransferEngine::check_room(uint64_t batch_id, size_t n) const {
    auto batch = batch_or_throw(batch_id);
    if (n > batch->capacity() - batch->submitted()) throw too_many_requests(*batch, n);
}

void TransferEngine::submit(uint64_t batch_id, const Request *reqs, size_t n,
                            const PendingNotify *notify) {
    auto batch = batch_or_throw(batch_id);
    if (n == 0) {
        if (notify) throw StatusError(kStatusInvalidArgument, "a notify needs at least one request");
        return;
    }
    if (!reqs) throw StatusError(kStatusInvalidArgument, "request array is null");
    auto too_many = [&]() { return too_many_requests(*batch, n); };
    if (n > batch->capacity() - batch->submitted()) throw too_many();

    // Per-thread scratch, so that a submit allocates nothing once warm. It
    // is emptied on every exit: items hold pins on local memory.
    thread_local std::vector<TransferItem> items;
    thread_local std::vector<TransferItem> group;
    thread_local std::vector<Target> descs;
    struct Scrub {
        ~Scrub() {
            items.clear();
            group.clear();
            descs.clear();
            // A huge batch must not pin its scratch to this thread forever.
            constexpr size_t kKeep = 16384;
            if (items.capacity() > kKeep) std::vector<TransferItem>().swap(items);
            if (group.capacity() > kKeep) std::vector<TransferItem>().swap(group);
        }
    } scrub;
    items.resize(n);

    // Validate everything before reserving slots, so a bad request leaves
    // the batch untouched.
    bool one_target = true;
    for (size_t i = 0; i < n; ++i) {
        if (i > 0 && reqs[i].target_id != reqs[0].target_id) one_target = false;
        prepare_item(reqs[i], i, descs, items[i]);
    }
    auto first = batch->reserve(n);
    if (!first) throw too_many();
    tasks_submitted_.fetch_add(n, std::memory_order_relaxed);
    if (notify) batch->set_notify(*notify);
    for (size_t i = 0; i < n; ++i) {
        items[i].batch = batch;
        items[i].task = *first + i;
    }

    // Hand each target's requests to its transport, in request order.
    if (one_target) dispatch(reqs[0].target_id, items, descs);
    else dispatch_by_target(reqs, items, group, descs);
}

void TransferEngine::prepare_item(const Request &r, size_t i, std::vector<Target> &targets, TransferItem &it) {
    auto where = [i]() { return "request " + std::to_string(i) + ": "; };
    if (r.opcode != kOpRead && r.opcode != kOpWrite)
        throw StatusError(kStatusInvalidArgument,
                          where() + "opcode " + std::to_string(r.opcode) + " is neither READ nor WRITE");
    if (r.length == 0) throw StatusError(kStatusInvalidArgument, where() + "length is zero");
    if (!r.source) throw StatusError(kStatusInvalidArgument, where() + "source is null");
    uint64_t src = reinterpret_cast<uint64_t>(r.source);
    if (src + r.length < src || r.target_offset + r.length < r.target_offset)
        throw StatusError(kStatusInvalidArgument,
                          where() + "range of " + std::to_string(r.length) + " bytes wraps around");
    bool known = r.target_id == kLocalSegment;
    for (const auto &t : targets) known = known || t.id == r.target_id;
    if (!known) {
        auto d = segments_.get(r.target_id);
        if (!d)
            throw StatusError(kStatusInvalidArgument, where() + "unknown segment id " +
                                                          std::to_string(r.target_id) + " (open the segment first)");
        PeerRoutes routes = peer_routes(*d, where());
        targets.push_back(Target{r.target_id, std::move(d), routes});
    }
    RegionPin pin = registry_.pin(src, r.length, /*need_remote=*/false);
    if (!pin)
        throw StatusError(kStatusAddressNotRegistered, where() + "local range [" + hex(src) + ", " +
                                                           hex(src + r.length) + ") is not inside one registered buffer");
    it.opcode = r.opcode;
    it.local = static_cast<char *>(r.source);
    it.remote_addr = r.target_offset;
    it.length = r.length;
    it.local_pin = std::move(pin);
}

void TransferEngine::dispatch_by_target(const Request *reqs, std::vector<TransferItem> &items,
                                        std::vector<TransferItem> &group, const std::vector<Target> &targets) {
    // One stable pass per distinct target would be O(n x targets); bucket
    // the indices by target once instead.
    std::unordered_map<int32_t, std::vector<size_t>> by_target;
    std::vector<int32_t> order;  // targets in first-seen order
    for (size_t i = 0; i < items.size(); ++i) {
        auto &bucket = by_target[reqs[i].target_id];
        if (bucket.empty()) order.push_back(reqs[i].target_id);
        bucket.push_back(i);
    }
    for (int32_t t : order) {
        group.clear();
        for (size_t i : by_target[t]) group.push_back(std::move(items[i]));
        dispatch(t, group, targets);
    }
}

PeerRoutes TransferEngine::peer_routes(const SegmentDesc &d, const std::string &where) const {
    PeerRoutes r;
    r.rdma = d.protocol == "rdma" && rdma() != nullptr;
    if (r.rdma) return r;
    // Not RDMA: the peer must be reachable over TCP (an RDMA peer counts
    // when it also publishes a TCP data port).
    if (d.protocol != "tcp" && !(d.protocol == "rdma" && d.tcp_data_port != 0))
        throw StatusError(kStatusNotSupportedTransport, where + "segment '" + d.name + "' uses protocol '" +
                                                            d.protocol + "', which this engine has not installed");
    if (!tcp_installed_.load())
        throw StatusError(kStatusNotSupportedTransport, where + "the TCP transport is not installed");
    if (d.tcp_data_port == 0)
        throw StatusError(kStatusInvalidArgument, where + "segment '" + d.name + "' advertises no TCP data port");
    bool this_host = !d.host_id.empty() && d.host_id == host_id_;
    r.cuda_ipc = ipc_ && this_host && d.process_token != process_token();
    // The owner offers the same-host transport and runs on this boot of this
    // host; its kernel-attested accept decides the rest.
    r.same_host = same_host_client_ && this_host && !d.same_host_socket.empty();
    return r;
}

Route TransferEngine::route_of(const PeerRoutes &p, const SegmentDesc &d, const TransferItem &it,
                               IpcTarget *ipc) const {
    if (p.rdma) return Route::Rdma;
    if (p.cuda_ipc) {
        for (const auto &b : d.buffers) {
            if (b.cuda_ipc.empty() || !range_within(it.remote_addr, it.length, b.addr, b.length)) continue;
            if (!ipc_->usable(b.cuda_ipc)) break;
            *ipc = IpcTarget{b.cuda_ipc, b.addr, b.length, b.cuda_ipc_offset, b.cuda_device};
            return Route::CudaIpc;
        }
    }
    // Only host memory, and only ranges inside the host buffers the owner
    // published: anything else goes over TCP, where the owner rejects what
    // it must.
    if (p.same_host && it.local_device() < 0 && d.in_host_buffer(it.remote_addr, it.length))
        return Route::SameHost;
    return Route::Tcp;
}

void TransferEngine::dispatch(int32_t target, std::vector<TransferItem> &items, const std::vector<Target> &descs) {
    if (target == kLocalSegment) {
        run_local(items);
        return;
    }
    const Target *t = nullptr;
    for (const auto &c : descs)
        if (c.id == target) t = &c;
    const std::shared_ptr<const SegmentDesc> &desc = t->desc;
    if (t->routes.rdma) {
        rdma()->submit(desc, items);
        return;
    }
    thread_local std::vector<TransferItem> via_same, via_tcp;
    std::vector<TransferItem> via_ipc;  // GPU-only path: allocating here is fine
    std::vector<IpcTarget> ipc_targets;
    via_same.clear();
    via_tcp.clear();
    for (auto &it : items) {
        IpcTarget ipc{};
        switch (route_of(t->routes, *desc, it, &ipc)) {
        case Route::CudaIpc:
            ipc_targets.push_back(std::move(ipc));
            via_ipc.push_back(std::move(it));
            break;
        case Route::SameHost: via_same.push_back(std::move(it)); break;
        default: via_tcp.push_back(std::move(it)); break;
        }
    }
    if (!via_tcp.empty()) send_tcp(*desc, via_tcp);
    if (!via_same.empty()) same_host_client_->submit(desc, via_same);
    if (!via_ipc.empty())
        ipc_->submit(via_ipc, ipc_targets, [this, desc](std::vector<TransferItem> &rerouted) { send_tcp(*desc, rerouted); });
    via_same.clear();
    via_tcp.clear();
}

void TransferEngine::send_tcp(const SegmentDesc &d, std::vector<TransferItem> &items) {
    const std::string &host = d.tcp_data_host.empty() ? parse_host_port(d.name).host : d.tcp_data_host;
    int version = (d.tcp_proto_version >= 2 && cfg_.tcp_proto_version >= 2) ? 2 : 1;
    tcp_client_->submit(host, d.tcp_data_port, version, items);
}

void TransferEngine::run_local(std::vector<TransferItem> &items) {
    // kLocalSegment: the target is our own memory; same rule as for peers.
    for (auto &it : items) {
        RegionPin target = registry_.pin(it.remote_addr, it.length, /*need_remote=*/true);
        if (!target) {
            it.fail("local-segment " + std::string(it.opcode == kOpWrite ? "WRITE" : "READ") +
                    " of " + std::to_string(it.length) + " bytes at " + hex(it.remote_addr) +
                    ": not inside one registered remote-accessible buffer");
            continue;
        }
        char *t = reinterpret_cast<char *>(it.remote_addr);
        char *dst = it.opcode == kOpWrite ? t : it.local;
        const char *src = it.opcode == kOpWrite ? it.local : t;
        bool device = target.region()->device >= 0 || (it.local_pin && it.local_pin.region()->device >= 0);
        if (device) {
            // Any direction between host and GPU memory, by the copy engines;
            // between two GPUs by the direct peer path when there is one.
            int target_device = target.region()->device;
            int local_device = it.local_device();
            try {
                if (it.opcode == kOpWrite) gpu::copy_between(dst, target_device, src, local_device, it.length);
                else gpu::copy_between(dst, local_device, src, target_device, it.length);
            } catch (const Error &e) {
                it.fail(std::string("local-segment GPU copy failed: ") + e.what());
                continue;
            }
        } else {
            std::memmove(dst, src, it.length);
        }
        target.release();
        local_copies_.fetch_add(1, std::memory_order_relaxed);
        it.complete();
    }
}

void TransferEngine::maybe_send_batch_notify(Batch &b) {
    auto n = b.take_notify_if_complete();
    if (!n) return;
    try {
        send_notify(n->segment_id, n->name, n->msg);
    } catch (const Error &e) {
        MC_LOG(Warn, "notify after batch " << b.id() << " failed: " << e.what());
    }
}

int TransferEngine::task_status(uint64_t batch_id, size_t task, uint64_t *bytes) {
    auto b = batch_or_throw(batch_id);
    if (task >= b->submitted())
        throw StatusError(kStatusInvalidArgument,
                          "task " + std::to_string(task) + " of batch " + std::to_string(batch_id) +
                              " does not exist (" + std::to_string(b->submitted()) + " submitted)");
    int s = b->observe(task, bytes);
    task_status_reads_.fetch_add(1, std::memory_order_relaxed);
    if (is_terminal(s)) maybe_send_batch_notify(*b);
    return s;
}

std::string TransferEngine::task_error(uint64_t batch_id, size_t task) {
    auto b = batch_or_throw(batch_id);
    if (task >= b->submitted())
        throw StatusError(kStatusInvalidArgument, "task " + std::to_string(task) + " does not exist");
    Task &t = b->task(task);
    if (t.status.load(std::memory_order_acquire) != kTaskFailed) return std::string();
    return t.error;
}

bool TransferEngine::wait_batch(uint64_t batch_id, int64_t timeout_ms) {
    auto b = batch_or_throw(batch_id);
    bool done = b->wait(timeout_ms);
    if (done) {
        size_t n = b->submitted();
        for (size_t i = 0; i < n; ++i) b->observe(i, nullptr);
        maybe_send_batch_notify(*b);
    }
    return done;
}

size_t TransferEngine::batch_statuses(uint64_t batch_id, size_t start, int *status, uint64_t *bytes,
                                      size_t cap) {
    auto b = batch_or_throw(batch_id);
    size_t n = b->submitted();
    size_t end = start < n ? start + std::min(cap, n - start) : start;
    bool any_terminal = false;
    for (size_t i = start; i < end; ++i) {
        uint64_t by = 0;
        int s = b->observe(i, &by);
        if (status) status[i - start] = s;
        if (bytes) bytes[i - start] = by;
        any_terminal = any_terminal || is_terminal(s);
    }
    if (end > start) task_status_reads_.fetch_add(end - start, std::memory_order_relaxed);
    if (any_terminal) maybe_send_batch_notify(*b);
    return n;
}

void TransferEngine::free_batch(uint64_t batch_id) {
    bool found = false;
    if (batches_.erase_if_idle(batch_id, found)) return;
    if (!found) throw StatusError(kStatusInvalidArgument, "unknown batch id " + std::to_string(batch_id));
    throw StatusError(kStatusBatchBusy,
                      "batch " + std::to_string(batch_id) +
                          " still has tasks that were not seen COMPLETED or FAILED");
}

void TransferEngine::reset_batch(uint64_t batch_id) {
    auto b = batch_or_throw(batch_id);
    if (!b->reset())
        throw StatusError(kStatusBatchBusy,
                          "batch " + std::to_string(batch_id) +
                              " still has tasks that were not seen COMPLETED or FAILED");
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
    HostPort hp = parse_host_port(target_name);
    Json body = Json::object();
    body.set("name", name);
    body.set("notify_msg", msg);
    Json r = handshake_request(hp.host, hp.port, kHsNotify, body, client_options(cfg_));
    if (json_string_or(r, "notify_msg", "").empty())
        throw Error(kErrMetadata, "segment '" + target_name + "' refused the notify");
}

}  // namespace mcrs
