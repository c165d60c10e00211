// RdmaTransport's NICs: device discovery (the allow / deny / MC_TE_FILTERS
// filter, port and GID choice, PD and CQ per NIC), the topology built over
// them, the port re-read after GID_CHANGE / PORT_ACTIVE, and what the
// descriptor and topology_json() publish about them.
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/text.h"
#include "transport/rdma/gid.h"
#include "transport/rdma/gpu_pci.h"
#include "transport/rdma/nic_filter.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/rdma/rdma_transport_internal.h"
#include "transport/rdma/sysfs_reader.h"

namespace mcrs::rdma {

using detail::to_ibv_gid;

namespace {

// "[a,b,c]", for error messages.
std::string join(const std::vector<std::string> &v) { return "[" + join_list(v) + "]"; }

Gid from_ibv_gid(const ibv::gid &g) {
    Gid out{};
    std::memcpy(&out, &g, sizeof out);
    return out;
}

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

// Frees what open_nic (or discovery) set up on one NIC, in reverse order.
void close_context(const ibv::VerbsApi &api, RdmaContext &c) {
    if (c.cq) api.destroy_cq(c.cq);
    if (c.pd) api.dealloc_pd(c.pd);
    if (c.ctx) api.close_device(c.ctx);
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
        NicInfo ni;
        std::string problem;
        auto c = open_nic(dev, name, ni, problem);
        if (!c) {
            problems.push_back(problem);
            continue;
        }
        infos.push_back(ni);
        opened.push_back(std::move(c));
    }
    for (const auto &p : problems) MC_LOG(Warn, "RDMA device not used: " << p);
    if (opened.empty()) {
        std::string why;
        for (const auto &p : problems) why += "; " + p;
        throw Error(kErrDeviceNotFound, "no usable RDMA device among " + join(fr.kept) + why);
    }
    try {
        build_topology(opened, infos);
    } catch (...) {
        for (auto &c : opened) close_context(api, *c);
        throw;
    }
    adopt_in_matrix_order(opened);
    MC_LOG(Info, "RDMA transport: " << ctxs_.size() << " NIC(s) via " << lib_->path());
}

std::unique_ptr<RdmaContext> RdmaTransport::open_nic(ibv::device *dev, const std::string &name, NicInfo &info,
                                                     std::string &problem) {
    const auto &api = lib_->api();
    auto c = std::make_unique<RdmaContext>();
    c->name = name;
    std::string ibdev_path = dev->ibdev_path;
    c->ctx = api.open_device(dev);
    if (!c->ctx) {
        problem = name + ": ibv_open_device failed: " + std::strerror(errno);
        return nullptr;
    }
    auto close_it = [&](const std::string &why) {
        problem = name + ": " + why;
        close_context(api, *c);
        return nullptr;
    };
    ibv::port_attr port{};
    int rc = lib_->query_port(c->ctx, static_cast<uint8_t>(cfg_.ib_port), &port);
    if (rc != 0)
        return close_it("ibv_query_port(" + std::to_string(cfg_.ib_port) + ") failed: " + std::strerror(rc));
    if (port.state != ibv::IBV_PORT_ACTIVE)
        return close_it("port " + std::to_string(cfg_.ib_port) + " is not ACTIVE");
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
        return close_it(e.what());
    }
    c->numa_node = read_ib_device(ibdev_path).numa_node;
    c->pd = api.alloc_pd(c->ctx);
    if (!c->pd) return close_it(std::string("ibv_alloc_pd failed: ") + std::strerror(errno));
    c->cq = api.create_cq(c->ctx, cfg_.max_cqe_per_ctx, c.get(), nullptr, 0);
    if (!c->cq) return close_it(std::string("ibv_create_cq failed: ") + std::strerror(errno));
    info.name = name;
    info.link_layer = c->link_layer;
    info.numa_node = c->numa_node;
    info.pci_path = read_ib_device(ibdev_path).pci_path;
    return c;
}

void RdmaTransport::build_topology(const std::vector<std::unique_ptr<RdmaContext>> &opened,
                                   const std::vector<NicInfo> &infos) {
    std::vector<int> nodes = list_numa_nodes(SysfsRoots().numa_nodes);
    for (const auto &c : opened)
        if (c->numa_node >= 0) {
            bool have = false;
            for (int x : nodes) have = have || x == c->numa_node;
            if (!have) nodes.push_back(c->numa_node);
        }
    topo_ = Topology::discover(infos, nodes, opt_.gpu_source ? opt_.gpu_source() : list_cuda_gpus(), "cuda");
    auto ov = load_topology_override(opt_.topology_json, cfg_.custom_topo_json);
    if (ov) {
        std::vector<std::string> known;
        for (const auto &c : opened) known.push_back(c->name);
        const char *source = opt_.topology_json.empty() ? "MC_CUSTOM_TOPO_JSON"
                                                        : "the topology given to installTransport";
        ov->require_known_devices(known, source);
        topo_ = *ov;
    }
}

void RdmaTransport::adopt_in_matrix_order(std::vector<std::unique_ptr<RdmaContext>> &opened) {
    for (const auto &name : topo_.hca_names()) {
        for (auto &c : opened)
            if (c && c->name == name) ctxs_.push_back(std::move(c));
    }
    for (auto &c : opened)
        if (c) close_context(lib_->api(), *c);  // opened but not in the matrix (custom topology)
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

void RdmaTransport::fill_descriptor(SegmentDesc &d) const {
    // A disabled NIC leaves the published matrix (docs/wire-protocol.md,
    // RDMA priority matrix). devices[], lkey[] and rkey[] follow the
    // published matrix's HCA order so the name sets stay equal and
    // index-based readers stay consistent. All down: publish all.
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
