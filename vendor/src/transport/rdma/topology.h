// The priority matrix (docs/wire-protocol.md, RDMA priority matrix): which
// NICs serve which memory location, its JSON form, the HCA index order, and
// device selection on both sides of a transfer (our own devices, and a
// peer's published devices).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/json.h"
#include "transport/rdma/link_layer.h"

namespace mcrs::rdma {

struct NicInfo {
    std::string name;
    LinkLayer link_layer = LinkLayer::Unknown;
    int numa_node = -1;    // -1 unknown
    std::string pci_path;  // realpath of the PCI function; "" unknown
    bool usable = true;    // uverbs node accessible and a port ACTIVE with a GID
};

struct GpuInfo {
    int ordinal = 0;
    std::string pci_bus_id;  // lower-case, e.g. "0000:3b:00.0"
    std::string pci_path;    // realpath of /sys/bus/pci/devices/<bus id>; "" unknown
    int numa_node = -1;
};

struct TopologyEntry {
    std::vector<std::string> preferred;
    std::vector<std::string> available;
    bool operator==(const TopologyEntry &o) const {
        return preferred == o.preferred && available == o.available;
    }
};

// Hops between two PCI functions: the path components of `a` after the
// longest common component prefix plus those of `b` (siblings behind one
// switch are 2 apart, a function and its own child 1). -1 when either path is
// empty.
int pci_distance(const std::string &a, const std::string &b);

// The pick rule (RDMA priority matrix) over one entry. retry <= 0: preferred[random % n]
// (available when preferred is empty). retry k > 0: entry (k-1) mod n of
// preferred followed by available. `excluded` (may be empty) skips devices,
// e.g. paused rails: at retry 0 the pick is made among the non-excluded ones;
// at retry k the walk goes forward from (k-1) mod n to the first non-excluded
// one. When every device is excluded the exclusion is ignored (a paused rail
// is better than none). nullopt only for an empty entry.
std::optional<std::string> pick_device(const TopologyEntry &entry, int retry, uint64_t random,
                                       const std::function<bool(const std::string &)> &excluded = {});

class Topology {
public:
    Topology() = default;

    // Discovery (RDMA priority matrix). Unusable NICs are left out. For every node N of
    // `numa_nodes` (when empty: node 0 alone): "cpu:N", preferred = NICs on N,
    // available = the others. For every GPU: "<gpu_prefix>:<ordinal>",
    // candidates = NICs on the GPU's NUMA node (all NICs when the GPU's node
    // is unknown or has none), preferred = candidates at minimal
    // pci_distance (all candidates when no distance is known; unknown
    // distances lose to known ones), available = every other NIC. Lists keep
    // the order of `nics`.
    static Topology discover(const std::vector<NicInfo> &nics, const std::vector<int> &numa_nodes,
                             const std::vector<GpuInfo> &gpus,
                             const std::string &gpu_prefix = "cuda");

    // The descriptor shape: {"<location>": [[preferred...], [available...]]}.
    // Strict: the value must be an object; every value an array of exactly
    // two arrays of non-empty strings (at most 255 bytes); location keys
    // non-empty. Upstream logs and then silently selects nothing; we throw
    // Error(error_code, "<what>: ...") naming the location. A name repeated
    // within one entry is kept once (first position; preferred wins).
    static Topology from_json(const Json &matrix, int error_code, const std::string &what);
    static Topology from_json_text(const std::string &text, int error_code,
                                   const std::string &what);
    // Reads an MC_CUSTOM_TOPO_JSON file (at most 16 MiB). Error(kErrInvalidArgument).
    static Topology from_file(const std::string &path);

    Json to_json() const;

    const std::map<std::string, TopologyEntry> &entries() const { return entries_; }
    // HCA index order. A pure function of the matrix: locations in byte-wise
    // sorted order, within one preferred then available, each name indexed
    // at its first appearance. Publish devices[], rkey[] and lkey[] in this
    // order (the name set equals the set of names in the matrix).
    const std::vector<std::string> &hca_names() const { return hca_; }
    int hca_index(const std::string &name) const;  // -1 when absent
    size_t device_count() const { return hca_.size(); }
    bool empty() const { return hca_.empty(); }

    // The entry for a location: its own, else the "*" entry when the matrix
    // has one, else the implicit wildcard (every device preferred, HCA order).
    // `exact` tells whether the location itself was found.
    TopologyEntry entry_for(const std::string &location, bool *exact = nullptr) const;

    // Pure selection: HCA index of pick_device over entry_for(location), -1
    // when the topology is empty. `excluded` gets HCA indexes.
    int select(const std::string &location, int retry, uint64_t random,
               const std::function<bool(int)> &excluded = {}) const;

    // Throws Error(kErrInvalidArgument) naming every device of the matrix not
    // in `known` (used for a custom topology: names must be local, usable NICs).
    void require_known_devices(const std::vector<std::string> &known,
                               const std::string &what) const;
    // Copy keeping only devices for which keep(name) is true; entries that
    // become empty are dropped. The HCA order is recomputed: re-publish
    // devices[]/rkey[]/lkey[] in the new order together with the new matrix.
    Topology filtered(const std::function<bool(const std::string &)> &keep) const;

private:
    void reindex();
    std::map<std::string, TopologyEntry> entries_;
    std::vector<std::string> hca_;
    std::map<std::string, int> index_;
};

// Chooses the local topology override, if any: `json_arg` (installTransport's
// args[0], a JSON string) wins over `env_file` (MC_CUSTOM_TOPO_JSON, a path).
// nullopt when both are empty. Throws Error(kErrInvalidArgument).
std::optional<Topology> load_topology_override(const std::string &json_arg,
                                               const std::string &env_file);

// Local device selection with upstream's randomness: at retry 0 a random
// preferred device, or (round_robin, MC_PATH_ROUNDROBIN) a shared counter.
// Thread-safe; the random source is per thread.
class DeviceSelector {
public:
    DeviceSelector(Topology topo, bool round_robin)
        : topo_(std::move(topo)), round_robin_(round_robin) {}
    // HCA index; -1 when the topology has no device.
    int select(const std::string &location, int retry,
               const std::function<bool(int)> &excluded = {});
    const Topology &topology() const { return topo_; }

private:
    Topology topo_;
    bool round_robin_;
    std::atomic<uint64_t> counter_{0};
};

// The reader side: a peer's published priority_matrix and devices[] names.
// The matrix is mapped to devices[] by name (so the NUMA preference survives
// whatever order the peer used); matrix names missing from devices[] are
// dropped (upstream would index past the arrays), devices[] names missing
// from the matrix are reachable only through the wildcard. A null/absent
// matrix means "no preferences". Throws Error(kErrMetadata) for a malformed
// matrix.
class PeerTopology {
public:
    static PeerTopology from_descriptor(const Json &priority_matrix,
                                        const std::vector<std::string> &devices);
    // Index into the peer's devices[], -1 when it has none. Unknown locations
    // fall back to "*" and then to every device. `paused(idx)` skips paused
    // rails while an alternative exists.
    int select(const std::string &location, int retry, uint64_t random,
               const std::function<bool(int)> &paused = {}) const;
    // The published entry for `location` (names): its own, else "*", else
    // every devices[] name preferred (devices[] order).
    TopologyEntry entry_for(const std::string &location) const;
    // First index of `name` in devices[], -1 when absent.
    int index_of(const std::string &name) const;
    size_t device_count() const { return devices_.size(); }
    const Topology &matrix() const { return topo_; }

private:
    Topology topo_;
    std::vector<std::string> devices_;
    std::map<std::string, int> by_name_;
};

}  // namespace mcrs::rdma
