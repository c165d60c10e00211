#include "metadata/metadata_directory.h"

#include "common/error.h"
#include "common/json.h"
#include "common/log.h"

namespace mcrs {

MetadataDirectory::MetadataDirectory(std::unique_ptr<MetadataStore> store, const std::string &cluster_id)
    : store_(std::move(store)), prefix_("mooncake/") {
    if (!cluster_id.empty()) {
        prefix_ += cluster_id;
        if (prefix_.back() != '/') prefix_ += '/';
    }
}

std::string MetadataDirectory::rpc_meta_key(const std::string &segment) const {
    return prefix_ + "rpc_meta/" + segment;
}

std::string MetadataDirectory::descriptor_key(const std::string &segment) const {
    // Upstream's rule: a name with '/' already says where it lives.
    if (segment.find('/') != std::string::npos) return prefix_ + segment;
    return prefix_ + "ram/" + segment;
}

void MetadataDirectory::publish_rpc_meta(const std::string &segment, const std::string &host, uint16_t port) {
    Json v = Json::object();
    v.set("ip_or_host_name", host);
    v.set("rpc_port", static_cast<uint64_t>(port));
    const std::string key = rpc_meta_key(segment);
    try {
        store_->put(key, v.dump());
    } catch (const Error &e) {
        throw Error(kErrMetadata, "cannot publish " + key + " to " + store_->describe() + ": " + e.what());
    }
}

void MetadataDirectory::publish_descriptor(const std::string &segment, const std::string &json) {
    const std::string key = descriptor_key(segment);
    try {
        store_->put(key, json);
    } catch (const Error &e) {
        throw Error(kErrMetadata, "cannot publish " + key + " to " + store_->describe() + ": " + e.what());
    }
}

void MetadataDirectory::withdraw(const std::string &segment) {
    for (const std::string &key : {rpc_meta_key(segment), descriptor_key(segment)}) {
        try {
            store_->remove(key);
        } catch (const Error &e) {
            MC_LOG(Warn, "could not remove " << key << " from " << store_->describe() << ": " << e.what());
        }
    }
}

std::string MetadataDirectory::fetch_descriptor(const std::string &segment) {
    const std::string key = descriptor_key(segment);
    std::string value;
    bool found;
    try {
        found = store_->get(key, value);
    } catch (const Error &e) {
        throw Error(kErrMetadata, "cannot read " + key + " from " + store_->describe() + ": " + e.what());
    }
    if (!found)
        throw Error(kErrMetadata, "segment '" + segment + "' is not published in " + store_->describe() +
                                      " (no key " + key + ")");
    return value;
}

HostPort MetadataDirectory::fetch_rpc_meta(const std::string &segment) {
    const std::string key = rpc_meta_key(segment);
    std::string value;
    bool found;
    try {
        found = store_->get(key, value);
    } catch (const Error &e) {
        throw Error(kErrMetadata, "cannot read " + key + " from " + store_->describe() + ": " + e.what());
    }
    if (!found)
        throw Error(kErrMetadata, "segment '" + segment + "' has no handshake address in " + store_->describe() +
                                      " (no key " + key + ")");
    auto bad = [&](const std::string &why) {
        return Error(kErrMetadata, key + " in " + store_->describe() + " " + why);
    };
    Json j;
    try {
        j = Json::parse(value, 8);
    } catch (const Error &e) {
        throw bad(std::string("is not JSON: ") + e.what());
    }
    const Json *h = j.find("ip_or_host_name");
    const Json *p = j.find("rpc_port");
    uint64_t port = 0;
    if (!h || !h->get_string() || h->get_string()->empty() || h->get_string()->size() > 255)
        throw bad("has no usable ip_or_host_name");
    if (!p || !p->get_u64(port) || port == 0 || port > 65535) throw bad("has no rpc_port in 1..65535");
    return HostPort{*h->get_string(), static_cast<uint16_t>(port)};
}

}  // namespace mcrs
