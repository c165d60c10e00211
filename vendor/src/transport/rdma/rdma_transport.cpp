#include "transport/rdma/rdma_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "common/range.h"
#include "gpu/gpu.h"
#include "transport/rdma/gid.h"
#include "transport/rdma/gpu_pci.h"
#include "transport/rdma/gpu_reg_mode.h"
#include "transport/rdma/handshake_desc.h"
#include "transport/rdma/nic_choice.h"
#include "transport/rdma/nic_filter.h"
#include "transport/rdma/slicer.h"
#include "transport/rdma/sysfs_reader.h"

namespace mcrs::rdma {

namespace {

std::string join(const std::vector<std::string> &v) {
    std::string s;
    for (const auto &x : v) s += (s.empty() ? "" : ",") + x;
    return "[" + s + "]";
}

std::string hexs(uint64_t v) {
    char b[32];
    snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
    return b;
}

ibv::gid to_ibv_gid(const Gid &g) {
    ibv::gid out{};
    static_assert(sizeof(out) == sizeof(g), "gid size");
    std::memcpy(&out, &g, sizeof out);
    return out;
}

Gid from_ibv_gid(const ibv::gid &g) {
    Gid out{};
    std::memcpy(&out, &g, sizeof out);
    return out;
}

constexpr int kQpAccess = ibv::IBV_ACCESS_LOCAL_WRITE | ibv::IBV_ACCESS_REMOTE_READ |
                          ibv::IBV_ACCESS_REMOTE_WRITE | ibv::IBV_ACCESS_REMOTE_ATOMIC;

int mtu_enum(int bytes) {
    switch (bytes) {
        case 512: return ibv::IBV_MTU_512;
        case 1024: return ibv::IBV_MTU_1024;
        case 2048: return ibv::IBV_MTU_2048;
        default: return ibv::IBV_MTU_4096;
    }
}

}  // namespace

struct RdmaTransport::Endpoint {
    size_t nic = 0;
    std::string key;
    std::string peer_path;
    std::vector<ibv::qp *> qps;
    std::vector<uint32_t> peer_qpn;
    EndpointState state = EndpointState::None;
    std::atomic<bool> broken{false};
    std::atomic<uint32_t> rr{0};
    std::mutex post_mu;
    std::unique_ptr<std::atomic<int>[]> qp_outstanding;  // per QP, <= MC_MAX_WR
    std::chrono::steady_clock::time_point ack_deadline;  // passive, WaitReadyAck
};

namespace {
struct ItemState {
    TransferItem item;
    std::atomic<size_t> remaining{0};
    std::mutex mu;
    std::string why;
};
}  // namespace

// Everything submit() derives from one peer descriptor and the usable local
// NICs, built once per (descriptor object, usable epoch) so that slices
// only index into it. Location plans are added lazily, under `mu`.
struct RdmaTransport::PeerRoute {
    std::weak_ptr<const SegmentDesc> desc;  // the version: a refetch is a new object
    uint64_t epoch = 0;                     // usable_epoch_ when built
    std::string error;                      // no common link layer etc.
    std::vector<size_t> lnics;              // local NICs of the agreed link layer
    std::vector<size_t> peer_nics;          // peer devices[] indexes, same
    PeerTopology topo;                      // the peer's published matrix
    std::vector<std::string> peer_paths;    // per devices[] index: "<server>@<dev>"
    std::vector<std::string> ep_keys;       // per nic * devices + index: active_ key
    std::mutex mu;
    std::map<std::string, std::shared_ptr<const NicPlan>> local_plans, peer_plans;  // by location

    const std::string &ep_key(size_t nic, size_t peer_idx) const {
        return ep_keys[nic * peer_paths.size() + peer_idx];
    }
    std::shared_ptr<const NicPlan> local_plan(const Topology &t, const std::string &location) {
        std::lock_guard<std::mutex> g(mu);
        auto &p = local_plans[location];
        if (!p) p = std::make_shared<const NicPlan>(plan_local_nics(t, location, lnics));
        return p;
    }
    // 6.5: the peer NICs of the target buffer's location (its "name").
    std::shared_ptr<const NicPlan> peer_plan(const std::string &location) {
        std::lock_guard<std::mutex> g(mu);
        auto &p = peer_plans[location];
        if (!p) p = std::make_shared<const NicPlan>(plan_peer_nics(topo, location, peer_nics));
        return p;
    }
};

struct RdmaTransport::Slice {
    std::shared_ptr<ItemState> item;
    std::shared_ptr<const SegmentDesc> peer;
    std::shared_ptr<PeerRoute> route;
    int opcode = 0;
    uint64_t local = 0, remote = 0, len = 0;
    size_t peer_buf = 0;
    std::shared_ptr<const NicPlan> plan;       // local NICs: stripe, then fallback
    std::shared_ptr<const NicPlan> peer_plan;  // peer devices[] indexes: stripe, then fallback
    size_t local_pos = 0, peer_pos = 0;        // into stripe + fallback of each
    long avoid_local = -1;               // a local fault happened on this NIC
    int retries = 0;
    std::shared_ptr<Endpoint> ep;
    size_t qp_index = 0;
    std::chrono::steady_clock::time_point deadline;   // back-pressure wait
    std::chrono::steady_clock::time_point posted_at;  // the slice timeout counts from here

    size_t nic() const { return local_at(*plan, local_pos); }
    size_t peer_idx() const { return nic_at(*peer_plan, peer_pos); }
};

RdmaTransport::RdmaTransport(RdmaTransportOptions opt, RdmaConfig cfg)
    : opt_(std::move(opt)),
      cfg_(std::move(cfg)),
      rails_(RailPolicy{5, 5000, static_cast<int64_t>(cfg_.rail_pause_seconds) * 1000}) {
    try {
        lib_ = &ibv::VerbsLibrary::load(opt_.verbs_library);
    } catch (const Error &e) {
        throw Error(kErrContext, std::string("cannot start the RDMA transport: ") + e.what() +
                                     ". Install rdma-core (libibverbs.so.1), point MC_VERBS_LIBRARY "
                                     "at a verbs library, or use the TCP protocol");
    }
    discover();
    poller_ = std::thread([this] { poller_loop(); });
    events_ = std::thread([this] { events_loop(); });
}

RdmaTransport::~RdmaTransport() {
    // Flush everything in flight: every QP to ERR, then let the poller
    // drain the flush completions (bounded wait); nothing is re-posted.
    closing_.store(true);
    {
        std::lock_guard<std::mutex> g(ep_mu_);
        for (auto *m : {&active_, &passive_})
            for (auto &kv : *m) drop_endpoint(kv.second);
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (inflight_.load() > 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    stop_.store(true);
    if (poller_.joinable()) poller_.join();
    if (events_.joinable()) events_.join();
    for (auto *s : pending_) finish_slice(s, false, "the RDMA transport is shutting down");
    pending_.clear();
    const auto &api = lib_->api();
    std::lock_guard<std::mutex> g(ep_mu_);
    for (auto *m : {&active_, &passive_})
        for (auto &kv : *m)
            for (auto *q : kv.second->qps) api.destroy_qp(q);
    active_.clear();
    passive_.clear();
    for (auto &gy : graveyard_)
        for (auto *q : gy->qps) api.destroy_qp(q);
    graveyard_.clear();
    // With every QP gone no completion can name these any more.
    {
        std::lock_guard<std::mutex> pg(posted_mu_);
        for (auto *z : zombies_) delete z;
        zombies_.clear();
        for (auto *s : posted_) finish_slice(s, false, "the RDMA transport is shutting down");
        posted_.clear();
    }
    {
        std::lock_guard<std::mutex> r(reg_mu_);
        for (auto &kv : regs_) {
            for (auto *m : kv.second.mrs)
                if (m) api.dereg_mr(m);
            if (kv.second.dmabuf_fd >= 0) ::close(kv.second.dmabuf_fd);
        }
        regs_.clear();
    }
    for (auto &c : ctxs_) {
        if (c->cq) api.destroy_cq(c->cq);
        if (c->pd) api.dealloc_pd(c->pd);
        if (c->ctx) api.close_device(c->ctx);
    }
}

namespace {

// A port's GID table with the sysfs facts select_gid ranks by (type,
// netdev); discovery and the GID_CHANGE refresh read it the same way so
// they make the same choice.
std::vector<GidEntry> read_gid_table(const ibv::VerbsApi &api, ibv::context *ctx, int port_num, int table_len,
                                     const std::string &ibdev_path, bool is_ib) {
    std::vector<GidEntry> table;
    for (int i = 0; i < table_len && i < 256; ++i) {
        GidEntry e;
        e.index = i;
        ibv::gid g{};
        if (api.query_gid(ctx, static_cast<uint8_t>(port_num), i, &g) != 0)
            e.queryable = false;
        else
            e.gid = from_ibv_gid(g);
        e.type = read_gid_type(ibdev_path, port_num, i, is_ib);
        e.netdev = read_gid_netdev(ibdev_path, port_num, i);
        table.push_back(e);
    }
    return table;
}

}  // namespace

void RdmaTransport::discover() {
    const auto &api = lib_->api();
    int n = 0;
    ibv::device **list = api.get_device_list(&n);
    if (!list || n <= 0) {
        if (list) api.free_device_list(list);
        throw Error(kErrDeviceNotFound, "no RDMA device found by " + lib_->path() +
                                            "; check the NIC driver (ibv_devices) or use the TCP protocol");
    }
    // Freed on every path (filter_devices and the topology code throw).
    struct ListGuard {
        const ibv::VerbsApi &api;
        ibv::device **list;
        ~ListGuard() {
            if (list) api.free_device_list(list);
        }
    } guard{api, list};
    std::vector<std::string> names;
    for (int i = 0; i < n; ++i) names.push_back(api.get_device_name(list[i]));
    NicFilterResult fr = filter_devices(names, opt_.allow, opt_.deny, cfg_.te_filters);
    if (fr.kept.empty()) {
        throw Error(kErrDeviceNotFound,
                    "no RDMA device left after filtering: found " + join(names) + ", allow list " +
                        join(opt_.allow) + ", deny list " + join(opt_.deny) + ", MC_TE_FILTERS " +
                        join(cfg_.te_filters) +
                        "; widen the allow list, shorten the deny list or unset MC_TE_FILTERS");
    }
    std::vector<std::unique_ptr<RdmaContext>> opened;
    std::vector<NicInfo> infos;
    std::vector<std::string> problems;
    for (const auto &name : fr.kept) {
        ibv::device *dev = nullptr;
        for (int i = 0; i < n; ++i)
            if (name == api.get_device_name(list[i])) dev = list[i];
        auto c = std::make_unique<RdmaContext>();
        c->name = name;
        std::string ibdev_path = dev->ibdev_path;
        c->ctx = api.open_device(dev);
        if (!c->ctx) {
            problems.push_back(name + ": ibv_open_device failed: " + std::strerror(errno));
            continue;
        }
        ibv::port_attr port{};
        int rc = lib_->query_port(c->ctx, static_cast<uint8_t>(cfg_.ib_port), &port);
        auto close_it = [&](const std::string &why) {
            problems.push_back(name + ": " + why);
            if (c->cq) api.destroy_cq(c->cq);
            if (c->pd) api.dealloc_pd(c->pd);
            api.close_device(c->ctx);
        };
        if (rc != 0) {
            close_it("ibv_query_port(" + std::to_string(cfg_.ib_port) + ") failed: " + std::strerror(rc));
            continue;
        }
        if (port.state != ibv::IBV_PORT_ACTIVE) {
            close_it("port " + std::to_string(cfg_.ib_port) + " is not ACTIVE");
            continue;
        }
        bool is_ib = port.link_layer != ibv::IBV_LINK_LAYER_ETHERNET;
        c->link_layer = is_ib ? LinkLayer::IB : LinkLayer::RoCE;
        c->lid = port.lid;
        c->active_mtu = port.active_mtu;
        std::vector<GidEntry> table =
            read_gid_table(api, c->ctx, cfg_.ib_port, port.gid_tbl_len, ibdev_path, is_ib);
        try {
            GidSelection sel = select_gid(table, cfg_.gid_index, name, cfg_.ib_port);
            c->gid_index = sel.index;
            c->gid = to_ibv_gid(sel.gid);
            c->gid_text = format_gid(sel.gid);
        } catch (const Error &e) {
            close_it(e.what());
            continue;
        }
        c->numa_node = read_ib_device(ibdev_path).numa_node;
        c->pd = api.alloc_pd(c->ctx);
        if (!c->pd) {
            close_it(std::string("ibv_alloc_pd failed: ") + std::strerror(errno));
            continue;
        }
        c->cq = api.create_cq(c->ctx, cfg_.max_cqe_per_ctx, c.get(), nullptr, 0);
        if (!c->cq) {
            close_it(std::string("ibv_create_cq failed: ") + std::strerror(errno));
            continue;
        }
        NicInfo ni;
        ni.name = name;
        ni.link_layer = c->link_layer;
        ni.numa_node = c->numa_node;
        ni.pci_path = read_ib_device(ibdev_path).pci_path;
        infos.push_back(ni);
        opened.push_back(std::move(c));
    }
    for (const auto &p : problems) MC_LOG(Warn, "RDMA device not used: " << p);
    if (opened.empty()) {
        std::string why;
        for (const auto &p : problems) why += "; " + p;
        throw Error(kErrDeviceNotFound, "no usable RDMA device among " + join(fr.kept) + why);
    }
    std::vector<int> nodes = list_numa_nodes(SysfsRoots().numa_nodes);
    for (const auto &c : opened)
        if (c->numa_node >= 0) {
            bool have = false;
            for (int x : nodes) have = have || x == c->numa_node;
            if (!have) nodes.push_back(c->numa_node);
        }
    try {
        topo_ = Topology::discover(infos, nodes,
                                   opt_.gpu_source ? opt_.gpu_source() : list_cuda_gpus(), "cuda");
        auto ov = load_topology_override(opt_.topology_json, cfg_.custom_topo_json);
        if (ov) {
            std::vector<std::string> known;
            for (const auto &c : opened) known.push_back(c->name);
            ov->require_known_devices(known, opt_.topology_json.empty()
                                                 ? "MC_CUSTOM_TOPO_JSON"
                                                 : "the topology given to installTransport");
            topo_ = *ov;
        }
    } catch (...) {
        for (auto &c : opened) {
            api.destroy_cq(c->cq);
            api.dealloc_pd(c->pd);
            api.close_device(c->ctx);
        }
        throw;
    }
    for (const auto &name : topo_.hca_names()) {
        for (auto &c : opened)
            if (c && c->name == name) ctxs_.push_back(std::move(c));
    }
    for (auto &c : opened)
        if (c) {
            // Opened but not in the matrix (custom topology): close it.
            api.destroy_cq(c->cq);
            api.dealloc_pd(c->pd);
            api.close_device(c->ctx);
        }
    MC_LOG(Info, "RDMA transport: " << ctxs_.size() << " NIC(s) via " << lib_->path());
}

// ---- memory ----

void RdmaTransport::register_region(uint64_t addr, uint64_t len, int device, bool remote,
                                    const std::string &location) {
    // Only remote-accessible buffers get remote access: the NIC itself then
    // refuses a peer's READ or WRITE of a local-only buffer, even one that
    // learned or guessed its key.
    int access = ibv::IBV_ACCESS_LOCAL_WRITE;
    if (remote) access |= ibv::IBV_ACCESS_REMOTE_WRITE | ibv::IBV_ACCESS_REMOTE_READ;
    if (lib_->supports_relaxed_ordering()) access |= ibv::IBV_ACCESS_RELAXED_ORDERING;
    Reg reg;
    reg.len = len;
    reg.remote = remote;
    reg.location = location.empty() ? "*" : location;
    RegPath path = RegPath::HostRegMr;
    gpu::DmabufExport dx;
    if (device >= 0) {
        GpuRegistrationMode mode = opt_.gpu_mode;
        if (mode == GpuRegistrationMode::FromEnv)
            mode = with_nvidia_peermem_from_env().value ? GpuRegistrationMode::PeerMem
                                                        : GpuRegistrationMode::DmaBuf;
        if (mode == GpuRegistrationMode::Auto)
            mode = resolve_registration(mode, peermem_module_loaded(), gpu::dmabuf_supported(device)).mode;
        path = mode == GpuRegistrationMode::DmaBuf ? RegPath::DmaBufRegMr : RegPath::PeerMemRegMr;
        if (path == RegPath::DmaBufRegMr) {
            gpu::dmabuf_export(reinterpret_cast<void *>(addr), len, dx);
            reg.dmabuf_fd = dx.fd;
        }
    }
    for (auto &c : ctxs_) {
        ibv::mr *m = nullptr;
        if (path == RegPath::DmaBufRegMr)
            m = lib_->reg_dmabuf_mr(c->pd, dx.offset, len, addr, dx.fd, access);
        else
            m = lib_->reg_mr(c->pd, reinterpret_cast<void *>(addr), len, access);
        if (!m) {
            int err = errno;
            for (auto *x : reg.mrs) lib_->api().dereg_mr(x);
            if (reg.dmabuf_fd >= 0) ::close(reg.dmabuf_fd);
            throw Error(kErrMemory, registration_failure_message(path, err, addr, len, c->name));
        }
        reg.mrs.push_back(m);
    }
    std::lock_guard<std::mutex> g(reg_mu_);
    regs_[addr] = std::move(reg);
}

void RdmaTransport::deregister_region(uint64_t addr) {
    Reg reg;
    {
        std::lock_guard<std::mutex> g(reg_mu_);
        auto it = regs_.find(addr);
        if (it == regs_.end()) return;
        reg = std::move(it->second);
        regs_.erase(it);
    }
    for (auto *m : reg.mrs)
        if (m) lib_->api().dereg_mr(m);
    if (reg.dmabuf_fd >= 0) ::close(reg.dmabuf_fd);
}

void RdmaTransport::fill_descriptor(SegmentDesc &d) const {
    // 6.6: a disabled NIC leaves the published matrix. devices[], lkey[] and
    // rkey[] follow the published matrix's HCA order so the name sets stay
    // equal and index-based readers stay consistent. All down: publish all.
    std::vector<size_t> order;
    Topology pub = topo_.filtered([this](const std::string &name) {
        for (const auto &c : ctxs_)
            if (c->name == name) return c->usable.load();
        return false;
    });
    if (pub.empty()) pub = topo_;
    for (const auto &name : pub.hca_names())
        for (size_t i = 0; i < ctxs_.size(); ++i)
            if (ctxs_[i]->name == name) order.push_back(i);
    d.protocol = "rdma";
    d.rdma_server_name = "";
    d.devices.clear();
    for (size_t i : order) {
        const RdmaContext &c = *ctxs_[i];
        DeviceDesc dd;
        dd.name = c.name;
        PortAddress pa = c.address();
        dd.gid = pa.gid_text;
        dd.lid = pa.lid;
        dd.link_layer = link_layer_name(c.link_layer);
        d.devices.push_back(dd);
    }
    d.priority_matrix = pub.to_json();
    std::lock_guard<std::mutex> g(reg_mu_);
    for (auto &b : d.buffers) {
        auto it = regs_.find(b.addr);
        if (it == regs_.end()) continue;
        b.lkey.clear();
        b.rkey.clear();
        for (size_t i : order) {
            b.lkey.push_back(it->second.mrs[i]->lkey);
            if (it->second.remote) b.rkey.push_back(it->second.mrs[i]->rkey);
        }
    }
}

// ---- endpoints ----

std::shared_ptr<RdmaTransport::Endpoint> RdmaTransport::create_qps(size_t nic) {
    const auto &api = lib_->api();
    RdmaContext &c = *ctxs_[nic];
    auto ep = std::make_shared<Endpoint>();
    ep->nic = nic;
    ep->qp_outstanding.reset(new std::atomic<int>[static_cast<size_t>(cfg_.num_qp_per_ep)]);
    for (int i = 0; i < cfg_.num_qp_per_ep; ++i) ep->qp_outstanding[i].store(0);
    for (int i = 0; i < cfg_.num_qp_per_ep; ++i) {
        ibv::qp_init_attr init{};
        init.send_cq = c.cq;
        init.recv_cq = c.cq;
        init.cap.max_send_wr = static_cast<uint32_t>(cfg_.max_wr);
        init.cap.max_recv_wr = 1;
        init.cap.max_send_sge = static_cast<uint32_t>(cfg_.max_sge);
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = static_cast<uint32_t>(cfg_.max_inline);
        init.qp_type = ibv::IBV_QPT_RC;
        init.sq_sig_all = 0;
        ibv::qp *q = api.create_qp(c.pd, &init);
        if (!q) {
            int err = errno;
            for (auto *x : ep->qps) api.destroy_qp(x);
            throw Error(kErrEndpoint, "ibv_create_qp on " + c.name + " failed: " + std::strerror(err));
        }
        ep->qps.push_back(q);
        ibv::qp_attr a{};
        a.qp_state = ibv::IBV_QPS_INIT;
        a.port_num = static_cast<uint8_t>(cfg_.ib_port);
        a.pkey_index = static_cast<uint16_t>(cfg_.pkey_index);
        a.qp_access_flags = kQpAccess;
        int rc = api.modify_qp(q, &a, ibv::IBV_QP_STATE | ibv::IBV_QP_PKEY_INDEX | ibv::IBV_QP_PORT |
                                          ibv::IBV_QP_ACCESS_FLAGS);
        if (rc != 0) {
            for (auto *x : ep->qps) api.destroy_qp(x);
            throw Error(kErrEndpoint, "QP to INIT on " + c.name + " failed: " + std::strerror(rc));
        }
    }
    return ep;
}

void RdmaTransport::connect_qps(Endpoint &ep, const std::vector<uint32_t> &peer_qpn,
                                const ibv::gid &peer_gid, uint32_t peer_lid) {
    const auto &api = lib_->api();
    RdmaContext &c = *ctxs_[ep.nic];
    PortAddress pa = c.address();
    for (size_t i = 0; i < ep.qps.size(); ++i) {
        ibv::qp_attr a{};
        a.qp_state = ibv::IBV_QPS_RTR;
        int mtu = mtu_enum(cfg_.mtu);
        a.path_mtu = static_cast<ibv::mtu>(pa.active_mtu < mtu ? pa.active_mtu : mtu);
        a.dest_qp_num = peer_qpn[i];
        a.rq_psn = 0;
        a.max_dest_rd_atomic = 16;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = peer_gid;
        a.ah_attr.grh.sgid_index = static_cast<uint8_t>(pa.gid_index);
        a.ah_attr.grh.hop_limit = 16;
        if (cfg_.ib_tc >= 0) a.ah_attr.grh.traffic_class = static_cast<uint8_t>(cfg_.ib_tc);
        a.ah_attr.dlid = static_cast<uint16_t>(peer_lid);
        a.ah_attr.sl = static_cast<uint8_t>(cfg_.sl());
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.static_rate = 0;
        a.ah_attr.port_num = static_cast<uint8_t>(cfg_.ib_port);
        int rc = api.modify_qp(ep.qps[i], &a,
                               ibv::IBV_QP_STATE | ibv::IBV_QP_AV | ibv::IBV_QP_PATH_MTU |
                                   ibv::IBV_QP_DEST_QPN | ibv::IBV_QP_RQ_PSN |
                                   ibv::IBV_QP_MAX_DEST_RD_ATOMIC | ibv::IBV_QP_MIN_RNR_TIMER);
        if (rc != 0)
            throw Error(kErrEndpoint, "QP to RTR on " + c.name + " failed: " + std::strerror(rc));
        ibv::qp_attr b{};
        b.qp_state = ibv::IBV_QPS_RTS;
        b.timeout = 14;
        b.retry_cnt = 7;
        b.rnr_retry = 7;
        b.sq_psn = 0;
        b.max_rd_atomic = 16;
        rc = api.modify_qp(ep.qps[i], &b,
                           ibv::IBV_QP_STATE | ibv::IBV_QP_TIMEOUT | ibv::IBV_QP_RETRY_CNT |
                               ibv::IBV_QP_RNR_RETRY | ibv::IBV_QP_SQ_PSN | ibv::IBV_QP_MAX_QP_RD_ATOMIC);
        if (rc != 0)
            throw Error(kErrEndpoint, "QP to RTS on " + c.name + " failed: " + std::strerror(rc));
    }
    ep.peer_qpn = peer_qpn;
}

void RdmaTransport::drop_endpoint(const std::shared_ptr<Endpoint> &ep) {
    // Called with ep_mu_ held or not; QPs go to ERR (flushing their WRs)
    // and are destroyed only at teardown, so late completions stay valid.
    if (ep->broken.exchange(true)) return;
    for (auto *q : ep->qps) {
        ibv::qp_attr a{};
        a.qp_state = ibv::IBV_QPS_ERR;
        lib_->api().modify_qp(q, &a, ibv::IBV_QP_STATE);
    }
}

std::shared_ptr<RdmaTransport::Endpoint> RdmaTransport::get_endpoint(size_t nic, const PeerRoute &route,
                                                                     size_t peer_idx) {
    const std::string &key = route.ep_key(nic, peer_idx);
    {
        // The common case: connected already; no handshake lock, no strings built.
        std::lock_guard<std::mutex> g(ep_mu_);
        auto it = active_.find(key);
        if (it != active_.end() && !it->second->broken.load()) return it->second;
    }
    auto peer_sp = route.desc.lock();
    if (!peer_sp) throw Error(kErrEndpoint, "the peer descriptor went away");
    const SegmentDesc &peer = *peer_sp;
    const DeviceDesc *pdev = &peer.devices[peer_idx];
    const std::string &peer_path = route.peer_paths[peer_idx];
    std::string own_path = make_nic_path(opt_.server_name, ctxs_[nic]->name);
    std::lock_guard<std::mutex> cg(connect_mu_);
    {
        std::lock_guard<std::mutex> g(ep_mu_);
        auto it = active_.find(key);
        if (it != active_.end()) {
            if (!it->second->broken.load()) return it->second;
            graveyard_.push_back(it->second);
            active_.erase(it);
        }
    }
    auto ep = create_qps(nic);
    ep->key = key;
    ep->peer_path = peer_path;
    auto fail = [&](int code, const std::string &why) {
        for (auto *q : ep->qps) lib_->api().destroy_qp(q);
        ep->qps.clear();
        throw Error(code, why);
    };
    std::vector<uint32_t> qpn;
    for (auto *q : ep->qps) qpn.push_back(q->qp_num);
    PortAddress own = ctxs_[nic]->address();
    if (peer_path == own_path) {
        try {
            connect_qps(*ep, qpn, own.gid, own.lid);
        } catch (const Error &e) {
            fail(e.code(), e.what());
        }
    } else {
        HandShakeDesc req = make_request(own_path, peer_path, own.lid, own.gid_text, qpn);
        req.ready_ack = false;
        HandShakeDesc rep;
        try {
            rep = decode_handshake(opt_.send_handshake(peer.name, encode_handshake(req), 0));
        } catch (const Error &e) {
            fail(kErrRejectHandshake, std::string("handshake with ") + peer_path + " failed: " + e.what());
        }
        ActiveCheck chk = check_active_reply(rep, own_path, peer_path, ep->qps.size());
        if (!chk.ok) fail(kErrRejectHandshake, chk.error);
        std::string gid_text = rep.local_gid;
        if (gid_text.empty() && pdev) gid_text = pdev->gid;
        auto g = parse_gid(gid_text);
        if (!g) fail(kErrRejectHandshake, "handshake with " + peer_path + ": no usable peer GID");
        try {
            connect_qps(*ep, rep.qp_num, to_ibv_gid(*g), rep.local_lid);
        } catch (const Error &e) {
            fail(e.code(), e.what());
        }
        if (chk.send_ready_ack) {
            HandShakeDesc ack = make_ack(req);
            HandShakeDesc ar;
            try {
                ar = decode_handshake(
                    opt_.send_handshake(peer.name, encode_handshake(ack), opt_.ready_ack_timeout_ms));
            } catch (const Error &e) {
                fail(kErrRejectHandshake, std::string("ready ACK to ") + peer_path + " failed (limit " +
                                              std::to_string(opt_.ready_ack_timeout_ms) + " ms): " + e.what());
            }
            ActiveCheck ac = check_ack_reply(ar);
            if (!ac.ok) fail(kErrRejectHandshake, "handshake with " + peer_path + ": " + ac.error);
        }
    }
    ep->state = EndpointState::Connected;
    std::lock_guard<std::mutex> g(ep_mu_);
    active_[key] = ep;
    return ep;
}

Json RdmaTransport::handle_connection(const Json &request) {
    HandShakeDesc req = decode_handshake(request);
    std::vector<std::string> own;
    for (const auto &c : ctxs_) own.push_back(c->name);
    std::lock_guard<std::mutex> cg(passive_mu_);
    std::string dev_guess, server;
    split_nic_path(req.peer_nic_path, server, dev_guess);
    std::string key = dev_guess + "|" + req.local_nic_path;
    std::shared_ptr<Endpoint> cur;
    EndpointView view;
    {
        std::lock_guard<std::mutex> g(ep_mu_);
        auto it = passive_.find(key);
        if (it != passive_.end() && !it->second->broken.load()) {
            cur = it->second;
            view.state = cur->state;
            view.peer_nic_path = cur->peer_path;
            view.peer_qp_num = cur->peer_qpn;
        }
    }
    PassiveDecision dec = check_passive_request(req, opt_.server_name, own,
                                                static_cast<size_t>(cfg_.num_qp_per_ep), view);
    auto reply_own = [&](const Endpoint &ep) {
        std::vector<uint32_t> qpn;
        for (auto *q : ep.qps) qpn.push_back(q->qp_num);
        const RdmaContext &c = *ctxs_[ep.nic];
        PortAddress pa = c.address();
        HandShakeDesc r = make_request(make_nic_path(opt_.server_name, c.name), req.local_nic_path,
                                       pa.lid, pa.gid_text, qpn);
        r.ready_ack = false;
        return encode_handshake(r);
    };
    switch (dec.action) {
        case PassiveAction::Reject: return encode_handshake(reject_handshake(dec.reply_msg));
        case PassiveAction::AckAccepted: {
            // The endpoint may have been torn down for a late ACK meanwhile.
            std::lock_guard<std::mutex> g(ep_mu_);
            if (!cur || cur->broken.load())
                return encode_handshake(reject_handshake("the ready ACK for " + req.local_nic_path +
                                                         " came after the endpoint was torn down"));
            cur->state = EndpointState::Connected;
            return encode_handshake(empty_handshake());
        }
        case PassiveAction::Reuse:
            if (cur) return reply_own(*cur);
            return encode_handshake(reject_handshake("no endpoint to reuse"));
        case PassiveAction::Rebuild:
            if (cur) {
                drop_endpoint(cur);
                std::lock_guard<std::mutex> g(ep_mu_);
                graveyard_.push_back(cur);
                passive_.erase(key);
            }
            break;
        case PassiveAction::Connect: break;
    }
    size_t nic = ctxs_.size();
    for (size_t i = 0; i < ctxs_.size(); ++i)
        if (ctxs_[i]->name == dec.local_device) nic = i;
    if (nic == ctxs_.size() || !ctxs_[nic]->usable.load())
        return encode_handshake(reject_handshake("device " + dec.local_device + " is not usable"));
    // upstream's protocol: an empty local_gid is looked up (with the
    // LID) in the requester's published devices[] by NIC name.
    std::string gid_text = req.local_gid;
    uint32_t peer_lid = req.local_lid;
    if (gid_text.empty()) {
        std::string who = lookup_requester_gid(req.local_nic_path, gid_text, peer_lid);
        if (!who.empty()) return encode_handshake(reject_handshake(who));
    }
    auto g = parse_gid(gid_text);
    if (!g)
        return encode_handshake(reject_handshake("the GID '" + gid_text + "' of " + req.local_nic_path +
                                                 " is not a valid GID"));
    std::shared_ptr<Endpoint> ep;
    try {
        ep = create_qps(nic);
        ep->key = key;
        ep->peer_path = req.local_nic_path;
        connect_qps(*ep, req.qp_num, to_ibv_gid(*g), peer_lid);
    } catch (const Error &e) {
        if (ep)
            for (auto *q : ep->qps) lib_->api().destroy_qp(q);
        return encode_handshake(reject_handshake(e.what()));
    }
    ep->state = dec.wait_for_ack ? EndpointState::WaitReadyAck : EndpointState::Connected;
    ep->ack_deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opt_.ready_ack_timeout_ms);
    Json out = reply_own(*ep);
    std::lock_guard<std::mutex> lg(ep_mu_);
    passive_[key] = ep;
    return out;
}

std::string RdmaTransport::lookup_requester_gid(const std::string &nic_path, std::string &gid,
                                                uint32_t &lid) {
    std::string server, dev;
    if (!split_nic_path(nic_path, server, dev))
        return "the request carries no local_gid and its local_nic_path '" + nic_path + "' is malformed";
    if (!opt_.fetch_descriptor)
        return "the request carries no local_gid and this engine cannot fetch descriptors; send the GID";
    SegmentDesc d;
    try {
        d = opt_.fetch_descriptor(server);
    } catch (const Error &e) {
        return "the request carries no local_gid and the descriptor of segment '" + server +
               "' could not be fetched: " + e.what();
    }
    for (const auto &x : d.devices)
        if (x.name == dev && !x.gid.empty()) {
            gid = x.gid;
            lid = x.lid;
            return "";
        }
    return "the request carries no local_gid and segment '" + server + "' publishes no device '" + dev +
           "' with a GID";
}

// ---- data path ----

std::string RdmaTransport::rail_key(size_t nic, const std::string &peer_path) const {
    return ctxs_[nic]->name + "|" + peer_path;
}

std::string RdmaTransport::peer_path_of(const Slice &s) const { return s.route->peer_paths[s.peer_idx()]; }

bool RdmaTransport::rail_paused(size_t nic, const PeerRoute &route, size_t peer_idx) const {
    return rails_.any_paused() && rails_.is_paused(rail_key(nic, route.peer_paths[peer_idx]));
}

std::shared_ptr<RdmaTransport::PeerRoute> RdmaTransport::route_for(
    const std::shared_ptr<const SegmentDesc> &peer) {
    uint64_t epoch = usable_epoch_.load();
    {
        std::lock_guard<std::mutex> g(routes_mu_);
        auto it = routes_.find(peer->name);
        if (it != routes_.end() && it->second->epoch == epoch && it->second->desc.lock() == peer)
            return it->second;
    }
    auto r = std::make_shared<PeerRoute>();
    r->desc = peer;
    r->epoch = epoch;
    std::vector<NicLink> local;
    std::vector<size_t> local_idx;
    for (size_t i = 0; i < ctxs_.size(); ++i)
        if (ctxs_[i]->usable.load()) {
            local.push_back(NicLink{ctxs_[i]->name, ctxs_[i]->link_layer});
            local_idx.push_back(i);
        }
    LinkPlan plan;
    try {
        if (local.empty()) throw Error(kErrDeviceNotFound, "no local RDMA NIC is usable (all ports down)");
        plan = plan_link_layer(local, peer_links_from_descriptor(peer->devices), peer->name);
        if (plan.local.empty() || plan.peer.empty())
            throw Error(kErrDeviceNotFound, "no common RDMA link layer with segment '" + peer->name + "'");
    } catch (const Error &e) {
        r->error = e.what();
    }
    for (size_t k : plan.local) r->lnics.push_back(local_idx[k]);
    std::sort(r->lnics.begin(), r->lnics.end());
    r->peer_nics = plan.peer;
    std::vector<std::string> names;
    for (const auto &d : peer->devices) names.push_back(d.name);
    try {
        r->topo = PeerTopology::from_descriptor(peer->priority_matrix, names);
    } catch (const Error &e) {
        // The matrix only steers the choice: without it every NIC is preferred.
        MC_LOG(Warn, "segment '" << peer->name << "': " << e.what() << "; its NIC preferences are ignored");
        r->topo = PeerTopology::from_descriptor(Json(), names);
    }
    for (const auto &n : names) r->peer_paths.push_back(make_nic_path(peer->name, n));
    for (size_t nic = 0; nic < ctxs_.size(); ++nic)
        for (const auto &pp : r->peer_paths) r->ep_keys.push_back(std::to_string(nic) + "|" + pp);
    std::lock_guard<std::mutex> g(routes_mu_);
    routes_[peer->name] = r;
    return r;
}

bool RdmaTransport::rail_paused(const std::string &local_nic, const std::string &peer_nic_path) const {
    return rails_.is_paused(local_nic + "|" + peer_nic_path);
}

uint32_t RdmaTransport::slice_timeout_ms() const {
    if (opt_.slice_timeout_ms) return opt_.slice_timeout_ms;
    if (cfg_.slice_timeout_s > 0) return static_cast<uint32_t>(cfg_.slice_timeout_s) * 1000u;
    return opt_.transfer_timeout_ms;
}

void RdmaTransport::submit(const std::shared_ptr<const SegmentDesc> &peer,
                           std::vector<TransferItem> &items) {
    std::shared_ptr<PeerRoute> route = route_for(peer);
    const std::string &plan_error = route->error;
    std::vector<Slice *> todo;
    for (auto &it : items) {
        if (!plan_error.empty()) {
            it.fail(plan_error);
            continue;
        }
        uint64_t laddr = reinterpret_cast<uint64_t>(it.local);
        // Local range inside one of our registrations?
        bool local_ok = false;
        std::string location;
        {
            std::lock_guard<std::mutex> g(reg_mu_);
            auto r = regs_.upper_bound(laddr);
            if (r != regs_.begin()) {
                --r;
                local_ok = range_within(laddr, it.length, r->first, r->second.len);
                location = r->second.location;
            }
        }
        if (!local_ok) {
            it.fail("local range " + hexs(laddr) + "+" + std::to_string(it.length) +
                    " is not registered with the RDMA transport");
            continue;
        }
        // Remote range inside one of the peer's published buffers with rkeys?
        size_t pb = peer->buffers.size();
        for (size_t b = 0; b < peer->buffers.size(); ++b) {
            const BufferDesc &bd = peer->buffers[b];
            if (range_within(it.remote_addr, it.length, bd.addr, bd.length)) {
                pb = b;
                break;
            }
        }
        if (pb == peer->buffers.size()) {
            it.fail("remote range " + hexs(it.remote_addr) + "+" + std::to_string(it.length) +
                    " is not inside a buffer published by segment '" + peer->name + "'");
            continue;
        }
        if (peer->buffers[pb].rkey.size() < peer->devices.size()) {
            it.fail("the buffer at " + hexs(peer->buffers[pb].addr) + " of segment '" + peer->name +
                    "' is not remote-accessible over RDMA (no rkey per device)");
            continue;
        }
        // The local NICs of the buffer's location (6.3) and the peer NICs of
        // the target buffer's location (6.5), the rest as fallback.
        auto lp = route->local_plan(topo_, location);
        auto pp = route->peer_plan(peer->buffers[pb].name);
        auto st = std::make_shared<ItemState>();
        uint64_t ss = cfg_.slice_size ? cfg_.slice_size : 65536;
        size_t nslices = static_cast<size_t>((it.length + ss - 1) / ss);
        st->remaining.store(nslices);
        st->item = std::move(it);
        for (size_t k = 0; k < nslices; ++k) {
            auto *s = new Slice;
            s->item = st;
            s->peer = peer;
            s->route = route;
            s->opcode = st->item.opcode;
            uint64_t off = k * ss;
            s->local = laddr + off;
            s->remote = st->item.remote_addr + off;
            s->len = std::min<uint64_t>(ss, st->item.length - off);
            s->peer_buf = pb;
            s->plan = lp;
            s->peer_plan = pp;
            s->local_pos = (k + next_rr_) % lp->stripe.size();
            s->peer_pos = (k + next_rr_) % pp->stripe.size();
            s->deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(opt_.transfer_timeout_ms);
            todo.push_back(s);
        }
        next_rr_ += nslices;
    }
    for (auto *s : todo) post_slice(s, false);
}

void RdmaTransport::post_slice(Slice *s, bool from_poller) {
    for (;;) {
        if (closing_.load()) {
            finish_slice(s, false, "the RDMA transport is shutting down");
            return;
        }
        // A usable local NIC of the stripe set (else a fallback) on a rail
        // that is not paused.
        RailPick pk = pick_rail(
            *s->plan, s->local_pos, *s->peer_plan, s->peer_pos,
            [this](size_t nic) { return ctxs_[nic]->usable.load(); },
            [this, s](size_t nic, size_t pidx) { return rail_paused(nic, *s->route, pidx); },
            s->avoid_local);
        if (!pk.found) {
            finish_slice(s, false, "no local RDMA NIC is usable for this transfer (ports down)");
            return;
        }
        s->local_pos = pk.local_pos;
        s->peer_pos = pk.peer_pos;
        size_t nic = s->nic();
        size_t pidx = s->peer_idx();
        RdmaContext &c = *ctxs_[nic];
        std::string err;
        bool full = false;
        try {
            auto ep = get_endpoint(nic, *s->route, pidx);
            uint32_t lkey = 0;
            {
                std::lock_guard<std::mutex> g(reg_mu_);
                auto r = regs_.upper_bound(s->local);
                if (r != regs_.begin()) --r;
                if (r != regs_.end() && s->local >= r->first &&
                    s->local + s->len <= r->first + r->second.len)
                    lkey = r->second.mrs[nic]->lkey;
                else
                    err = "local memory was unregistered";
            }
            if (err.empty()) {
                ibv::sge sg{s->local, static_cast<uint32_t>(s->len), lkey};
                ibv::send_wr wr{};
                wr.wr_id = reinterpret_cast<uint64_t>(s);
                wr.sg_list = &sg;
                wr.num_sge = 1;
                wr.opcode = s->opcode == 0 ? ibv::IBV_WR_RDMA_READ : ibv::IBV_WR_RDMA_WRITE;
                wr.send_flags = ibv::IBV_SEND_SIGNALED;
                wr.wr.rdma.remote_addr = s->remote;
                wr.wr.rdma.rkey = s->peer->buffers[s->peer_buf].rkey[pidx];
                ibv::send_wr *bad = nullptr;
                std::lock_guard<std::mutex> pg(ep->post_mu);
                size_t nq = ep->qps.size();
                size_t qi = nq;
                for (size_t t = 0; t < nq; ++t) {
                    size_t cand = ep->rr.fetch_add(1) % nq;
                    if (ep->qp_outstanding[cand].load() < cfg_.max_wr) {
                        qi = cand;
                        break;
                    }
                }
                if (qi == nq || c.outstanding.load() >= cfg_.max_cqe_per_ctx) {
                    full = true;
                } else {
                    s->ep = ep;
                    s->qp_index = qi;
                    s->posted_at = std::chrono::steady_clock::now();
                    ep->qp_outstanding[qi].fetch_add(1);
                    c.outstanding.fetch_add(1);
                    inflight_.fetch_add(1);
                    {
                        // Before posting: the completion may beat us back.
                        std::lock_guard<std::mutex> g(posted_mu_);
                        posted_.insert(s);
                    }
                    int rc = ibv::post_send(ep->qps[qi], &wr, &bad);
                    if (rc == 0) {
                        c.wrs.fetch_add(1);
                        return;
                    }
                    {
                        std::lock_guard<std::mutex> g(posted_mu_);
                        posted_.erase(s);
                    }
                    inflight_.fetch_sub(1);
                    c.outstanding.fetch_sub(1);
                    ep->qp_outstanding[qi].fetch_sub(1);
                    s->ep.reset();
                    if (rc == ENOMEM) {
                        full = true;
                    } else {
                        err = "ibv_post_send on " + c.name + " failed: " + std::strerror(rc);
                        drop_endpoint(ep);
                    }
                }
            }
        } catch (const Error &e) {
            err = e.what();
        }
        if (full) {
            // Back-pressure: the send queues / CQ of this NIC are full.
            if (std::chrono::steady_clock::now() > s->deadline) {
                finish_slice(s, false, "timed out waiting for a free send-queue slot on NIC " + c.name);
                return;
            }
            if (from_poller) {
                std::lock_guard<std::mutex> g(pending_mu_);
                pending_.push_back(s);
                return;
            }
            std::this_thread::sleep_for(std::chrono::microseconds(20));
            continue;
        }
        retry_slice(s, err, /*blame=*/true, /*avoid_local=*/false, from_poller);
        return;
    }
}

void RdmaTransport::retry_slice(Slice *s, const std::string &why, bool blame, bool avoid_local,
                                bool from_poller) {
    size_t nic = s->nic();
    RdmaContext &c = *ctxs_[nic];
    c.errors.fetch_add(1);
    if (blame) {
        // 6.6: pause at once when another rail can carry the slice, else
        // after RailPolicy::error_threshold errors in the window.
        bool alt = false;
        size_t nl = plan_size(*s->plan), np = plan_size(*s->peer_plan);
        size_t cur_peer = s->peer_idx();
        for (size_t lp = 0; lp < nl && !alt; ++lp) {
            size_t l = local_at(*s->plan, lp);
            if (!ctxs_[l]->usable.load()) continue;
            for (size_t pp = 0; pp < np && !alt; ++pp) {
                size_t pidx = nic_at(*s->peer_plan, pp);
                if (l == nic && pidx == cur_peer) continue;
                alt = !rail_paused(l, *s->route, pidx);
            }
        }
        std::string rail = rail_key(nic, peer_path_of(*s));
        if (rails_.record_error(rail, alt))
            MC_LOG(Warn, "RDMA rail " << rail << " paused for " << rails_.policy().pause_ms << " ms after errors");
    }
    int next = s->retries + 1;
    if (closing_.load() || next >= cfg_.retry_cnt) {
        finish_slice(s, false, why + " (after " + std::to_string(next) + " attempt(s), MC_RETRY_CNT " +
                                   std::to_string(cfg_.retry_cnt) + ")");
        return;
    }
    MC_LOG(Warn, why << "; retrying on another rail");
    s->retries = next;
    c.retries.fetch_add(1);
    s->avoid_local = avoid_local ? static_cast<long>(nic) : -1;
    ++s->local_pos;
    ++s->peer_pos;
    post_slice(s, from_poller);
}

void RdmaTransport::finish_slice(Slice *s, bool ok, const std::string &why) {
    auto st = s->item;
    delete s;
    if (!ok) {
        std::lock_guard<std::mutex> g(st->mu);
        if (st->why.empty()) st->why = why;
    }
    if (st->remaining.fetch_sub(1) == 1) {
        std::string w;
        {
            std::lock_guard<std::mutex> g(st->mu);
            w = st->why;
        }
        if (w.empty())
            st->item.complete();
        else
            st->item.fail(w);
    }
}

void RdmaTransport::expire_slices() {
    auto now = std::chrono::steady_clock::now();
    uint32_t limit = slice_timeout_ms();
    auto lim = std::chrono::milliseconds(limit);
    std::vector<Slice *> late;
    {
        std::lock_guard<std::mutex> g(posted_mu_);
        for (auto *s : posted_)
            if (now - s->posted_at > lim) late.push_back(s);
        for (auto *s : late) {
            posted_.erase(s);
            zombies_.insert(s);
        }
    }
    const char *knob = opt_.slice_timeout_ms ? "slice timeout"
                       : cfg_.slice_timeout_s > 0 ? "MC_SLICE_TIMEOUT" : "transfer timeout";
    for (auto *z : late) {
        // The WR may still complete (stalled) or never (lost): the original
        // stays a zombie until then; a copy carries the retry.
        RdmaContext &c = *ctxs_[z->nic()];
        inflight_.fetch_sub(1);
        c.outstanding.fetch_sub(1);
        if (z->ep) {
            z->ep->qp_outstanding[z->qp_index].fetch_sub(1);
            drop_endpoint(z->ep);
        }
        auto *s = new Slice(*z);
        s->ep.reset();
        z->item.reset();
        z->peer.reset();
        z->route.reset();
        z->ep.reset();
        std::string why = "RDMA " + std::string(s->opcode == 0 ? "READ" : "WRITE") + " of " +
                          std::to_string(s->len) + " bytes on NIC " + c.name + " to " + peer_path_of(*s) +
                          " got no completion within " + std::to_string(limit) + " ms (" + knob + ")";
        MC_LOG(Warn, why);
        retry_slice(s, why, /*blame=*/true, /*avoid_local=*/false, /*from_poller=*/true);
    }
}

void RdmaTransport::poller_loop() {
    ibv::wc wcs[32];
    auto next_sweep = std::chrono::steady_clock::now();
    while (!stop_.load()) {
        int got = 0;
        for (size_t i = 0; i < ctxs_.size(); ++i) {
            RdmaContext &c = *ctxs_[i];
            int n = ibv::poll_cq(c.cq, 32, wcs);
            if (n < 0) {
                MC_LOG(Error, "ibv_poll_cq on " << c.name << " failed");
                continue;
            }
            got += n;
            for (int k = 0; k < n; ++k) {
                auto *s = reinterpret_cast<Slice *>(wcs[k].wr_id);
                {
                    std::lock_guard<std::mutex> g(posted_mu_);
                    if (zombies_.erase(s)) {
                        delete s;  // timed out earlier; a copy was retried
                        continue;
                    }
                    posted_.erase(s);
                }
                inflight_.fetch_sub(1);
                c.outstanding.fetch_sub(1);
                if (s->ep) s->ep->qp_outstanding[s->qp_index].fetch_sub(1);
                int status = wcs[k].status;
                if (status == ibv::IBV_WC_SUCCESS) {
                    c.bytes.fetch_add(s->len);
                    s->ep.reset();
                    finish_slice(s, true, "");
                    continue;
                }
                // A failed WR leaves its QP in ERR: this endpoint (only) is
                // replaced. The peer rail is blamed only for remote faults.
                CompletionDecision d = decide_completion(status, s->retries, cfg_.retry_cnt);
                if (s->ep) drop_endpoint(s->ep);
                s->ep.reset();
                std::string why = "RDMA " + std::string(s->opcode == 0 ? "READ" : "WRITE") + " of " +
                                  std::to_string(s->len) + " bytes on NIC " + c.name + " to " +
                                  peer_path_of(*s) + " failed: " + ibv::wc_status_name(status);
                retry_slice(s, why, d.blame_peer_rail, d.change_local_nic, /*from_poller=*/true);
            }
        }
        std::vector<Slice *> parked;
        {
            std::lock_guard<std::mutex> g(pending_mu_);
            parked.swap(pending_);
        }
        for (auto *s : parked) post_slice(s, true);
        got += static_cast<int>(parked.size());
        auto now = std::chrono::steady_clock::now();
        if (now >= next_sweep) {
            next_sweep = now + std::chrono::milliseconds(10);
            expire_slices();
        }
        if (got == 0)
            std::this_thread::sleep_for(std::chrono::microseconds(inflight_.load() > 0 ? 20 : 200));
    }
}

void RdmaTransport::expire_ack_waits() {
    auto now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> g(ep_mu_);
    for (auto it = passive_.begin(); it != passive_.end();) {
        auto &ep = it->second;
        if (ep->state == EndpointState::WaitReadyAck && now > ep->ack_deadline) {
            MC_LOG(Warn, "no ready ACK from " << ep->peer_path << " within " << opt_.ready_ack_timeout_ms
                                              << " ms; endpoint torn down");
            drop_endpoint(ep);
            graveyard_.push_back(ep);
            it = passive_.erase(it);
        } else {
            ++it;
        }
    }
}

bool RdmaTransport::refresh_port(size_t nic) {
    const auto &api = lib_->api();
    RdmaContext &c = *ctxs_[nic];
    uint8_t port_num = static_cast<uint8_t>(cfg_.ib_port);
    ibv::port_attr port{};
    int rc = lib_->query_port(c.ctx, port_num, &port);
    if (rc != 0 || port.state != ibv::IBV_PORT_ACTIVE) {
        MC_LOG(Warn, "RDMA " << c.name << ": port " << cfg_.ib_port << " not re-read ("
                             << (rc ? std::strerror(rc) : "not ACTIVE") << "); address kept");
        return false;
    }
    // The table as discovery reads it, so select_gid makes the same choice.
    bool is_ib = c.link_layer == LinkLayer::IB;
    std::string ibdev_path = c.ctx->device ? c.ctx->device->ibdev_path : "";
    std::vector<GidEntry> table = read_gid_table(api, c.ctx, cfg_.ib_port, port.gid_tbl_len, ibdev_path, is_ib);
    GidSelection sel;
    try {
        sel = select_gid(table, cfg_.gid_index, c.name, cfg_.ib_port);
    } catch (const Error &e) {
        MC_LOG(Warn, "RDMA " << c.name << ": no usable GID after the change (" << e.what() << "); address kept");
        return false;
    }
    ibv::gid g = to_ibv_gid(sel.gid);
    std::lock_guard<std::mutex> lk(c.addr_mu);
    bool changed = c.gid_index != sel.index || std::memcmp(&c.gid, &g, sizeof g) != 0 ||
                   c.lid != port.lid || c.active_mtu != port.active_mtu;
    if (changed)
        MC_LOG(Warn, "RDMA " << c.name << ": address now GID index " << sel.index << " "
                             << format_gid(sel.gid) << ", LID " << port.lid);
    c.gid_index = sel.index;
    c.gid = g;
    c.gid_text = format_gid(sel.gid);
    c.lid = port.lid;
    c.active_mtu = port.active_mtu;
    return changed;
}

void RdmaTransport::events_loop() {
    const auto &api = lib_->api();
    std::vector<pollfd> fds;
    for (auto &c : ctxs_) {
        int fl = fcntl(c->ctx->async_fd, F_GETFL);
        fcntl(c->ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
        fds.push_back(pollfd{c->ctx->async_fd, POLLIN, 0});
    }
    while (!stop_.load()) {
        expire_ack_waits();
        for (auto &p : fds) p.revents = 0;
        int rc = ::poll(fds.data(), fds.size(), 50);
        if (rc <= 0) continue;
        for (size_t i = 0; i < fds.size(); ++i) {
            if (!(fds[i].revents & POLLIN)) continue;
            ibv::async_event ev{};
            if (api.get_async_event(ctxs_[i]->ctx, &ev) != 0) continue;
            int type = ev.event_type;
            ibv::qp *q = (type == ibv::IBV_EVENT_QP_FATAL || type == ibv::IBV_EVENT_QP_REQ_ERR ||
                          type == ibv::IBV_EVENT_QP_ACCESS_ERR)
                             ? ev.element.qp
                             : nullptr;
            api.ack_async_event(&ev);
            RdmaContext &c = *ctxs_[i];
            MC_LOG(Warn, "RDMA async event on " << c.name << ": " << ibv::event_type_name(type));
            // 6.6: the GID (or LID/MTU) may have moved; the descriptor built
            // from it is fresh on the next read. Endpoints set up with the old
            // address go, so the next post re-handshakes.
            bool readdressed = (type == ibv::IBV_EVENT_GID_CHANGE || type == ibv::IBV_EVENT_PORT_ACTIVE) &&
                               refresh_port(i);
            std::lock_guard<std::mutex> g(ep_mu_);
            if (readdressed)
                for (auto *m : {&active_, &passive_})
                    for (auto &kv : *m)
                        if (kv.second->nic == i) drop_endpoint(kv.second);
            if (type == ibv::IBV_EVENT_PORT_ERR || type == ibv::IBV_EVENT_DEVICE_FATAL) {
                c.disabled_event.store(type);
                c.usable.store(false);
                usable_epoch_.fetch_add(1);
                for (auto *m : {&active_, &passive_})
                    for (auto &kv : *m)
                        if (kv.second->nic == i) drop_endpoint(kv.second);
            } else if (type == ibv::IBV_EVENT_PORT_ACTIVE) {
                c.usable.store(true);
                usable_epoch_.fetch_add(1);
            } else if (q) {
                for (auto *m : {&active_, &passive_})
                    for (auto &kv : *m)
                        for (auto *x : kv.second->qps)
                            if (x == q) drop_endpoint(kv.second);
            }
        }
    }
}

std::vector<RdmaNicCounters> RdmaTransport::counters() const {
    std::vector<RdmaNicCounters> out;
    for (const auto &c : ctxs_) {
        RdmaNicCounters n;
        n.name = c->name;
        n.link_layer = link_layer_name(c->link_layer);
        n.numa_node = c->numa_node;
        n.usable = c->usable.load();
        n.wrs = c->wrs.load();
        n.bytes = c->bytes.load();
        n.errors = c->errors.load();
        n.retries = c->retries.load();
        out.push_back(n);
    }
    return out;
}

Json RdmaTransport::topology_json() const {
    Json j = Json::object();
    Json devs = Json::array();
    for (const auto &c : ctxs_) {
        Json d = Json::object();
        d.set("name", c->name);
        d.set("link_layer", link_layer_name(c->link_layer));
        d.set("numa_node", static_cast<int64_t>(c->numa_node));
        d.set("usable", c->usable.load());
        PortAddress pa = c->address();
        d.set("gid", pa.gid_text);
        d.set("lid", static_cast<uint64_t>(pa.lid));
        devs.push(d);
    }
    j.set("devices", devs);
    j.set("priority_matrix", topo_.to_json());
    return j;
}

}  // namespace mcrs::rdma
