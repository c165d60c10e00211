// Transport administration: automatic choice at creation, uninstalling,
// NIC discovery on demand and the links report (showLinks).
#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "engine/transfer_engine.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/samehost/samehost_server.h"
#include "transport/tcp/tcp_server.h"

namespace mcrs {

void TransferEngine::install_auto_transport() {
    ProcessOverrides env = ProcessOverrides::from_env();
    if (!env.force_tcp) {
        try {
            install_transport("rdma");
            return;
        } catch (const Error &e) {
            if (env.force_hca)
                throw Error(e.code(), std::string("MC_FORCE_HCA is set but RDMA did not come up: ") + e.what());
            MC_LOG(Info, "auto-discovery: no usable RDMA NIC (" << e.what() << "); using TCP");
        }
    } else {
        MC_LOG(Info, "auto-discovery: MC_FORCE_TCP is set; using TCP");
    }
    install_transport("tcp");
}

void TransferEngine::uninstall_transport(const std::string &proto) {
    std::lock_guard<std::mutex> g(install_mu_);
    if (proto == "rdma") {
        auto old = std::atomic_exchange(&rdma_, std::shared_ptr<rdma::RdmaTransport>());
        if (!old) throw Error(kErrInvalidArgument, "transport 'rdma' is not installed on this engine");
        MC_LOG(Info, "RDMA transport uninstalled; it goes once no call uses it any more");
        republish("uninstalling the RDMA transport");
        return;  // `old` released here, or by the last submit still holding it
    }
    if (proto != "tcp")
        throw Error(kErrInvalidArgument, "unknown transport '" + proto + "' (this engine has 'tcp' and 'rdma')");
    if (!tcp_installed_.exchange(false))
        throw Error(kErrInvalidArgument, "transport 'tcp' is not installed on this engine");
    tcp_retired_ = true;
    // Serving threads stop; the client stays until destruction so that
    // requests it already holds finish (nothing new is routed to it).
    if (same_host_server_) same_host_server_->stop();
    if (tcp_server_) tcp_server_->stop();
    MC_LOG(Info, "TCP transport uninstalled (data port " << tcp_port_ << " closed)");
    republish("uninstalling the TCP transport");
}

size_t TransferEngine::discover_topology() {
    if (auto t = rdma()) {
        size_t moved = t->rediscover();
        MC_LOG(Info, "discoverTopology: " << t->nic_count() << " RDMA NIC(s), " << moved << " readdressed");
        // New GIDs/LIDs are in the descriptor: a store must hold them too.
        if (moved > 0) republish("re-addressing RDMA NICs");
        return t->nic_count();
    }
    std::lock_guard<std::mutex> g(install_mu_);
    try {
        // Probed as an install would, then released.
        rdma::RdmaTransport probe(rdma_options(""));
        discovered_ = probe.topology_json();
        discovery_note_.clear();
        return probe.nic_count();
    } catch (const Error &e) {
        discovered_ = Json();
        discovery_note_ = e.what();
        MC_LOG(Info, "discoverTopology: no usable RDMA NIC (" << e.what() << ")");
        return 0;
    }
}

namespace {

Json nic_list(const Json &topology, const char *source) {
    Json out = Json::array();
    const Json *devs = topology.is_object() ? topology.find("devices") : nullptr;
    if (!devs || !devs->is_array()) return out;
    for (const Json &d : *devs->get_array()) {
        Json n = Json::object();
        n.set("device", json_string_or(d, "name", ""));
        const Json *numa = d.find("numa_node");
        n.set("numa", numa ? *numa : Json(static_cast<int64_t>(-1)));
        n.set("gid", json_string_or(d, "gid", ""));
        n.set("link_layer", json_string_or(d, "link_layer", ""));
        const Json *usable = d.find("usable");
        n.set("usable", usable ? *usable : Json(false));
        n.set("source", source);
        out.push(n);
    }
    return out;
}

std::string readable(const Json &report) {
    std::ostringstream os;
    os << "=== Local NICs ===\n";
    const Json *nics = report.find("local_nics");
    const Json::Array none;
    const Json::Array &list = nics && nics->get_array() ? *nics->get_array() : none;
    if (list.empty()) os << "  (no RDMA devices found)\n";
    for (const Json &n : list)
            os << "  " << json_string_or(n, "device", "") << "  NUMA=" << n.find("numa")->dump()
               << "  GID=" << json_string_or(n, "gid", "") << "  " << json_string_or(n, "link_layer", "")
               << (n.find("usable")->dump() == "true" ? "" : "  (unusable)") << "  [" << json_string_or(n, "source", "")
               << "]\n";
    const Json *topo = report.find("topology");
    if (topo && topo->is_object() && !topo->get_object()->empty()) {
        os << "\n=== Topology (NIC Selection) ===\n";
        for (const auto &kv : *topo->get_object()) {
            const Json::Array &lists = kv.second.get_array() ? *kv.second.get_array() : none;
            os << "  " << kv.first << " -> preferred: " << (lists.size() > 0 ? lists[0].dump() : "[]")
               << "  available: " << (lists.size() > 1 ? lists[1].dump() : "[]") << "\n";
        }
    }
    const Json *tr = report.find("transports");
    os << "\n=== Transports ===\n  " << (tr ? tr->dump() : "[]") << "\n";
    const Json *note = report.find("rdma_unavailable");
    if (note) os << "  RDMA unavailable: " << json_string_or(report, "rdma_unavailable", "") << "\n";
    return os.str();
}

}  // namespace

std::string TransferEngine::show_links(bool json) const {
    Json report = Json::object();
    Json transports = Json::array();
    if (has_tcp()) transports.push("tcp");
    if (auto t = rdma()) {
        transports.push("rdma");
        Json topo = t->topology_json();
        report.set("local_nics", nic_list(topo, "rdma_transport"));
        report.set("topology", *topo.find("priority_matrix"));
    } else {
        std::lock_guard<std::mutex> g(install_mu_);
        report.set("local_nics", nic_list(discovered_, "topology"));
        const Json *m = discovered_.is_object() ? discovered_.find("priority_matrix") : nullptr;
        report.set("topology", m ? *m : Json::object());
        if (!discovery_note_.empty()) report.set("rdma_unavailable", discovery_note_);
    }
    report.set("transports", transports);
    return json ? report.dump() : readable(report);
}

}  // namespace mcrs
