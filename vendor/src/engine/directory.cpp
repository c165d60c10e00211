// Centralised metadata: what this engine publishes about itself and how it
// finds peers through an etcd, Redis or HTTP store (metadata/). In
// P2PHANDSHAKE mode none of this runs: a segment name is the owner's
// handshake address and descriptors come over the handshake port.
#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "common/log.h"
#include "engine/identity.h"
#include "engine/transfer_engine.h"
#include "metadata/metadata_directory.h"

namespace mcrs {

void TransferEngine::open_directory() {
    MetadataStoreOptions o;
    o.timeout_ms = cfg_.metadata_timeout_ms;
    o.connect_timeout_ms = std::min<uint32_t>(cfg_.metadata_timeout_ms, 1500);
    o.lease_ttl_s = cfg_.metadata_lease_ttl_s;
    o.redis_username = cfg_.redis_username;
    o.redis_password = cfg_.redis_password;
    o.redis_db = cfg_.redis_db;
    // A descriptor read from the store is bounded as one fetched over the
    // handshake port is.
    o.max_value_bytes = cfg_.handshake_max_length;
    directory_ = std::make_unique<MetadataDirectory>(make_metadata_store(cfg_.metadata_conn_string, o),
                                                     cfg_.metadata_cluster_id);
    // Upstream's rule: the name is taken as it is (its port is not bound),
    // and peers learn the handshake address from rpc_meta.
    segment_name_ = cfg_.local_server_name;
    local_host_ = cfg_.advertise_host.empty() ? first_interface_address() : cfg_.advertise_host;
    if (local_host_.empty())
        throw Error(kErrInvalidArgument,
                    "no network interface other than loopback is up, so there is no address to publish for "
                    "this engine; set advertise_host (MC_TCP_BIND_ADDRESS)");
}

void TransferEngine::publish_rpc_meta() {
    if (!directory_) return;
    try {
        directory_->publish_rpc_meta(segment_name_, local_host_, rpc_port_);
    } catch (const Error &e) {
        std::string msg = e.what();
        // Upstream's Python HTTP server never overwrites an rpc_meta key:
        // an engine that died without deleting it blocks its name.
        if (msg.find("Duplicate rpc_meta") != std::string::npos)
            msg += " (an engine named '" + segment_name_ +
                   "' did not remove its keys, e.g. it crashed: delete " + directory_->rpc_meta_key(segment_name_) +
                   " from the server, or use another name; mooncake-metadata-server "
                   "--allow-rpc-meta-overwrite accepts the new engine instead)";
        throw Error(kErrMetadata, msg);
    }
}

void TransferEngine::publish_descriptor() {
    if (!directory_) return;
    // Under one lock from snapshot to PUT: concurrent (un)registrations
    // cannot leave an older snapshot as the last one stored.
    std::lock_guard<std::mutex> g(publish_mu_);
    directory_->publish_descriptor(segment_name_, encode_segment_desc(local_descriptor()).dump());
}

void TransferEngine::withdraw_from_directory() {
    if (directory_) directory_->withdraw(segment_name_);
}

SegmentDesc TransferEngine::fetch_from_directory(const std::string &name) {
    const std::string text = directory_->fetch_descriptor(name);
    SegmentDesc d;
    try {
        d = decode_segment_desc(Json::parse(text));
    } catch (const Error &e) {
        throw Error(kErrMetadata, "segment '" + name + "' in " + directory_->describe() + ": " + e.what());
    }
    // Notifies and handshakes go to the descriptor's name: it must be the
    // one looked up, not whatever another writer of the store put there.
    if (d.name != name)
        throw Error(kErrMetadata, "segment '" + name + "' in " + directory_->describe() +
                                      ": the descriptor names itself '" + d.name.substr(0, 256) + "'");
    {
        // A new descriptor may come with a new handshake address.
        std::lock_guard<std::mutex> g(rpc_mu_);
        rpc_addrs_.erase(name);
    }
    // Descriptors without tcp_data_host (older upstream engines) are
    // reached at their rpc_meta host.
    if (d.tcp_data_host.empty()) d.tcp_data_host = handshake_address(name).host;
    return d;
}

HostPort TransferEngine::handshake_address(const std::string &name) {
    if (!directory_) return parse_host_port(name);
    {
        std::lock_guard<std::mutex> g(rpc_mu_);
        auto it = rpc_addrs_.find(name);
        if (it != rpc_addrs_.end()) return it->second;
    }
    HostPort hp = directory_->fetch_rpc_meta(name);
    std::lock_guard<std::mutex> g(rpc_mu_);
    // Bounded: one entry per segment this engine has looked up, as the
    // segment cache itself.
    rpc_addrs_[name] = hp;
    return hp;
}

void TransferEngine::start_refresher() {
    if (cfg_.metadata_refresh_interval_s == 0) return;
    refresher_ = std::thread([this] {
        const auto every = std::chrono::seconds(cfg_.metadata_refresh_interval_s);
        std::unique_lock<std::mutex> lk(refresh_mu_);
        while (!refresh_cv_.wait_for(lk, every, [this] { return refresh_stop_; })) {
            lk.unlock();
            try {
                // Logs what fails; old descriptors stay. Stops between
                // segments once the engine is being destroyed.
                segments_.refresh_all([this] {
                    std::lock_guard<std::mutex> g(refresh_mu_);
                    return refresh_stop_;
                });
            } catch (const std::exception &e) {
                MC_LOG(Warn, "background descriptor refresh failed: " << e.what());
            }
            lk.lock();
        }
    });
}

void TransferEngine::stop_refresher() {
    {
        std::lock_guard<std::mutex> g(refresh_mu_);
        refresh_stop_ = true;
    }
    refresh_cv_.notify_all();
    if (refresher_.joinable()) refresher_.join();
}

}  // namespace mcrs
