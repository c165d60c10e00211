#include "transport/rdma/topology.h"

#include <algorithm>
#include <limits>
#include <random>
#include <set>
#include <thread>

#include "common/text.h"
#include "common/error.h"
#include "common/log.h"
#include "transport/rdma/sysfs_reader.h"

namespace mcrs::rdma {

namespace {

std::vector<std::string> components(const std::string &path) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : path) {
        if (c == '/') {
            if (!cur.empty()) out.push_back(cur);
            cur.clear();
        } else {
            cur.push_back(c);
        }
    }
    if (!cur.empty()) out.push_back(cur);
    return out;
}

constexpr size_t kMaxNameLength = 255;

}  // namespace

int pci_distance(const std::string &a, const std::string &b) {
    if (a.empty() || b.empty()) return -1;
    std::vector<std::string> ca = components(a), cb = components(b);
    size_t common = 0;
    while (common < ca.size() && common < cb.size() && ca[common] == cb[common]) ++common;
    return static_cast<int>((ca.size() - common) + (cb.size() - common));
}

std::optional<std::string> pick_device(const TopologyEntry &entry, int retry, uint64_t random,
                                       const std::function<bool(const std::string &)> &excluded) {
    auto ok = [&](const std::string &n) { return !excluded || !excluded(n); };
    if (retry <= 0) {
        for (const auto *list : {&entry.preferred, &entry.available}) {
            std::vector<const std::string *> pool;
            for (const auto &n : *list)
                if (ok(n)) pool.push_back(&n);
            if (!pool.empty()) return *pool[random % pool.size()];
        }
        const auto &list = entry.preferred.empty() ? entry.available : entry.preferred;
        if (list.empty()) return std::nullopt;
        return list[random % list.size()];
    }
    size_t n = entry.preferred.size() + entry.available.size();
    if (n == 0) return std::nullopt;
    auto at = [&](size_t i) -> const std::string & {
        return i < entry.preferred.size() ? entry.preferred[i]
                                          : entry.available[i - entry.preferred.size()];
    };
    size_t start = static_cast<size_t>(retry - 1) % n;
    for (size_t step = 0; step < n; ++step) {
        const std::string &name = at((start + step) % n);
        if (ok(name)) return name;
    }
    return at(start);
}

Topology Topology::discover(const std::vector<NicInfo> &nics, const std::vector<int> &numa_nodes,
                            const std::vector<GpuInfo> &gpus, const std::string &gpu_prefix) {
    std::vector<const NicInfo *> usable;
    std::set<std::string> seen;
    for (const NicInfo &n : nics)
        if (n.usable && !n.name.empty() && seen.insert(n.name).second) usable.push_back(&n);
    Topology t;
    if (usable.empty()) return t;
    std::vector<int> nodes = numa_nodes;
    if (nodes.empty()) nodes.push_back(0);
    for (int node : nodes) {
        TopologyEntry e;
        for (const NicInfo *n : usable)
            (n->numa_node == node ? e.preferred : e.available).push_back(n->name);
        t.entries_["cpu:" + std::to_string(node)] = std::move(e);
    }
    for (const GpuInfo &g : gpus) {
        std::vector<const NicInfo *> cands;
        if (g.numa_node >= 0)
            for (const NicInfo *n : usable)
                if (n->numa_node == g.numa_node) cands.push_back(n);
        if (cands.empty()) cands = usable;
        int best = std::numeric_limits<int>::max();
        for (const NicInfo *n : cands) {
            int d = pci_distance(g.pci_path, n->pci_path);
            if (d >= 0) best = std::min(best, d);
        }
        std::set<std::string> pref;
        for (const NicInfo *n : cands) {
            int d = pci_distance(g.pci_path, n->pci_path);
            if (best == std::numeric_limits<int>::max() || d == best) pref.insert(n->name);
        }
        TopologyEntry e;
        for (const NicInfo *n : usable)
            (pref.count(n->name) ? e.preferred : e.available).push_back(n->name);
        t.entries_[gpu_prefix + ":" + std::to_string(g.ordinal)] = std::move(e);
    }
    t.reindex();
    return t;
}

Topology Topology::from_json(const Json &matrix, int error_code, const std::string &what) {
    auto fail = [&](const std::string &why) { throw Error(error_code, what + ": " + why); };
    const Json::Object *obj = matrix.get_object();
    if (!obj) fail("the priority matrix must be a JSON object of \"<location>\": [[preferred...], [available...]]");
    Topology t;
    for (const auto &kv : *obj) {
        const std::string &loc = kv.first;
        if (loc.empty()) fail("a location key is empty");
        std::string at = "location \"" + (loc.size() > 64 ? loc.substr(0, 64) + "..." : loc) + "\"";
        const Json::Array *pair = kv.second.get_array();
        if (!pair || pair->size() != 2)
            fail(at + " must map to an array of exactly two arrays [[preferred...], [available...]]");
        TopologyEntry e;
        std::set<std::string> in_entry;
        for (int which = 0; which < 2; ++which) {
            const Json::Array *names = (*pair)[which].get_array();
            const char *label = which == 0 ? "preferred" : "available";
            if (!names) fail(at + ": the " + label + " list is not an array");
            for (size_t i = 0; i < names->size(); ++i) {
                const std::string *n = (*names)[i].get_string();
                if (!n || n->empty() || n->size() > kMaxNameLength)
                    fail(at + ": " + label + "[" + std::to_string(i) +
                         "] is not a device name (non-empty string of at most 255 bytes)");
                if (!in_entry.insert(*n).second) continue;
                (which == 0 ? e.preferred : e.available).push_back(*n);
            }
        }
        t.entries_[loc] = std::move(e);
    }
    t.reindex();
    return t;
}

Topology Topology::from_json_text(const std::string &text, int error_code, const std::string &what) {
    Json j;
    try {
        j = Json::parse(text);
    } catch (const Error &e) {
        throw Error(error_code, what + ": not valid JSON (" + e.what() + ")");
    }
    return from_json(j, error_code, what);
}

Topology Topology::from_file(const std::string &path) {
    std::string what = "MC_CUSTOM_TOPO_JSON file \"" + path + "\"";
    auto text = read_sysfs_text(path, size_t(16) << 20);
    if (!text) throw Error(kErrInvalidArgument, what + " cannot be read (missing, unreadable or over 16 MiB)");
    return from_json_text(*text, kErrInvalidArgument, what);
}

Json Topology::to_json() const {
    Json out = Json::object();
    for (const auto &kv : entries_) {
        Json pref = Json::array(), avail = Json::array();
        for (const auto &n : kv.second.preferred) pref.push(n);
        for (const auto &n : kv.second.available) avail.push(n);
        Json pair = Json::array();
        pair.push(pref);
        pair.push(avail);
        out.set(kv.first, pair);
    }
    return out;
}

void Topology::reindex() {
    hca_.clear();
    index_.clear();
    for (const auto &kv : entries_)
        for (const auto *list : {&kv.second.preferred, &kv.second.available})
            for (const auto &n : *list)
                if (index_.emplace(n, static_cast<int>(hca_.size())).second) hca_.push_back(n);
}

int Topology::hca_index(const std::string &name) const {
    auto it = index_.find(name);
    return it == index_.end() ? -1 : it->second;
}

TopologyEntry Topology::entry_for(const std::string &location, bool *exact) const {
    // An entry that lists no device (valid JSON shape) counts as absent, so
    // a location can never make every device unreachable.
    auto usable = [](const TopologyEntry &e) { return !e.preferred.empty() || !e.available.empty(); };
    auto it = entries_.find(location);
    if (exact) *exact = it != entries_.end();
    if (it != entries_.end() && usable(it->second)) return it->second;
    it = entries_.find("*");
    if (it != entries_.end() && usable(it->second)) return it->second;
    TopologyEntry all;
    all.preferred = hca_;
    return all;
}

int Topology::select(const std::string &location, int retry, uint64_t random,
                     const std::function<bool(int)> &excluded) const {
    TopologyEntry e = entry_for(location);
    std::function<bool(const std::string &)> skip;
    if (excluded) skip = [&](const std::string &n) { return excluded(hca_index(n)); };
    auto name = pick_device(e, retry, random, skip);
    return name ? hca_index(*name) : -1;
}

void Topology::require_known_devices(const std::vector<std::string> &known,
                                     const std::string &what) const {
    std::set<std::string> k(known.begin(), known.end());
    std::string missing;
    for (const auto &n : hca_)
        if (!k.count(n)) missing += (missing.empty() ? "" : ", ") + n;
    if (missing.empty()) return;
    std::string have;
    for (const auto &n : known) have += (have.empty() ? "" : ", ") + n;
    throw Error(kErrInvalidArgument, what + " names devices that are not usable local RDMA devices: " +
                                         missing + " (usable: " + (have.empty() ? "none" : have) + ")");
}

Topology Topology::filtered(const std::function<bool(const std::string &)> &keep) const {
    Topology t;
    for (const auto &kv : entries_) {
        TopologyEntry e;
        for (const auto &n : kv.second.preferred)
            if (keep(n)) e.preferred.push_back(n);
        for (const auto &n : kv.second.available)
            if (keep(n)) e.available.push_back(n);
        if (!e.preferred.empty() || !e.available.empty()) t.entries_[kv.first] = std::move(e);
    }
    t.reindex();
    return t;
}

std::optional<Topology> load_topology_override(const std::string &json_arg,
                                               const std::string &env_file) {
    if (!trim(json_arg).empty())
        return Topology::from_json_text(json_arg, kErrInvalidArgument, "topology JSON argument");
    if (!trim(env_file).empty()) return Topology::from_file(trim(env_file));
    return std::nullopt;
}

namespace {

uint64_t thread_random() {
    thread_local std::mt19937_64 rng([] {
        std::random_device rd;
        uint64_t seed = (uint64_t(rd()) << 32) ^ rd();
        return seed ^ std::hash<std::thread::id>()(std::this_thread::get_id());
    }());
    return rng();
}

}  // namespace

int DeviceSelector::select(const std::string &location, int retry,
                           const std::function<bool(int)> &excluded) {
    uint64_t r = 0;
    if (retry <= 0) r = round_robin_ ? counter_.fetch_add(1, std::memory_order_relaxed) : thread_random();
    return topo_.select(location, retry, r, excluded);
}

PeerTopology PeerTopology::from_descriptor(const Json &priority_matrix,
                                           const std::vector<std::string> &devices) {
    PeerTopology p;
    p.devices_ = devices;
    for (size_t i = 0; i < devices.size(); ++i)
        p.by_name_.emplace(devices[i], static_cast<int>(i));
    if (priority_matrix.is_null()) return p;
    Topology raw = Topology::from_json(priority_matrix, kErrMetadata,
                                       "unsupported segment descriptor: priority_matrix");
    p.topo_ = raw.filtered([&](const std::string &n) { return p.by_name_.count(n) != 0; });
    if (p.topo_.device_count() != raw.device_count())
        MC_LOG(Debug, "peer priority_matrix names " << raw.device_count() - p.topo_.device_count()
                                                    << " device(s) missing from its devices[]; ignored");
    return p;
}

TopologyEntry PeerTopology::entry_for(const std::string &location) const {
    const auto &entries = topo_.entries();
    auto it = entries.find(location);
    if (it == entries.end()) it = entries.find("*");
    if (it != entries.end()) return it->second;
    TopologyEntry e;
    std::set<std::string> seen;
    for (const auto &n : devices_)
        if (seen.insert(n).second) e.preferred.push_back(n);
    return e;
}

int PeerTopology::index_of(const std::string &name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? -1 : it->second;
}

int PeerTopology::select(const std::string &location, int retry, uint64_t random,
                         const std::function<bool(int)> &paused) const {
    if (by_name_.empty()) return -1;
    TopologyEntry e = entry_for(location);
    std::function<bool(const std::string &)> skip;
    if (paused) skip = [&](const std::string &n) { return paused(by_name_.at(n)); };
    auto name = pick_device(e, retry, random, skip);
    if (!name) return -1;
    return by_name_.at(*name);
}

}  // namespace mcrs::rdma
