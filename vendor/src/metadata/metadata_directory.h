// The engine's view of a centralised metadata store: upstream's key layout
// and values on top of a MetadataStore (docs/wire-protocol.md, Metadata
// stores).
//
//   <prefix>rpc_meta/<segment name>  {"ip_or_host_name":"...","rpc_port":N}
//   <prefix>ram/<segment name>       the segment descriptor
//   <prefix><segment name>           the descriptor, when the name holds '/'
//
// <prefix> is "mooncake/", or "mooncake/<cluster id>/" with
// MC_METADATA_CLUSTER_ID.
#pragma once

#include <memory>
#include <string>

#include "common/host_port.h"
#include "metadata/metadata_store.h"

namespace mcrs {

class MetadataDirectory {
public:
    MetadataDirectory(std::unique_ptr<MetadataStore> store, const std::string &cluster_id);

    // Key names (public for tests and messages).
    const std::string &prefix() const { return prefix_; }
    std::string rpc_meta_key(const std::string &segment) const;
    std::string descriptor_key(const std::string &segment) const;

    // Publishes where this engine's handshake port is; throws
    // Error(kErrMetadata).
    void publish_rpc_meta(const std::string &segment, const std::string &host, uint16_t port);
    // Publishes this engine's descriptor (compact JSON).
    void publish_descriptor(const std::string &segment, const std::string &json);
    // Removes both keys; best effort (failures are logged), for shutdown.
    void withdraw(const std::string &segment);

    // A peer's descriptor text; throws Error(kErrMetadata) naming the key
    // when it is not published.
    std::string fetch_descriptor(const std::string &segment);
    // A peer's handshake address from its rpc_meta key (checked: a host of
    // 1..255 bytes and a port in 1..65535); throws Error(kErrMetadata).
    HostPort fetch_rpc_meta(const std::string &segment);

    std::string describe() const { return store_->describe(); }

private:
    std::unique_ptr<MetadataStore> store_;
    std::string prefix_;
};

}  // namespace mcrs
