// Stores of segment metadata for the centralised modes (upstream's
// "metadata plugins"): an etcd cluster (its v3 JSON gateway), a Redis
// server (RESP) or an HTTP metadata server, chosen by the connection
// string. The engine puts, gets and deletes whole values under keys it
// builds (metadata/metadata_keys.h); a store only moves bytes, adding
// what its backend's upstream writers add (etcd and Redis values end with
// a newline, HTTP values do not).
//
// The clients are ours, small and bounded, rather than libraries: the C
// API must work on its own (programs written against upstream's header,
// no Rust), the engine links no third-party C++ library, and every call
// needs a deadline and size caps that general-purpose clients make hard to
// guarantee.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace mcrs {

struct MetadataStoreOptions {
    // The whole of one call (every endpoint tried, connect included).
    uint32_t timeout_ms = 5000;
    // One TCP connect.
    uint32_t connect_timeout_ms = 1500;
    // Largest value read back (a descriptor with many buffers is tens of
    // KiB; upstream's etcd client allows 32 MiB).
    uint64_t max_value_bytes = 32ull << 20;
    // 0 (upstream's behaviour): keys live until deleted. Otherwise etcd
    // keys are attached to a lease of this many seconds and Redis keys
    // expire after it, both kept alive by the store while it lives, so a
    // crashed engine's keys vanish. Readers see the same values.
    uint32_t lease_ttl_s = 0;
    // Redis only (upstream's MC_REDIS_USERNAME, MC_REDIS_PASSWORD,
    // MC_REDIS_DB_INDEX).
    std::string redis_username;
    std::string redis_password;
    int redis_db = 0;
};

class MetadataStore {
public:
    virtual ~MetadataStore() = default;
    // The value stored under `key`; false when there is none. Throws
    // Error(kErrMetadata) naming the server and the cause when it cannot
    // be reached in time or answers something else than a value or "no
    // such key".
    virtual bool get(const std::string &key, std::string &value) = 0;
    // Stores `value` under `key` (replacing any). Throws as get.
    virtual void put(const std::string &key, const std::string &value) = 0;
    // Deletes `key`; false when there was none. Throws as get.
    virtual bool remove(const std::string &key) = 0;
    // "etcd 127.0.0.1:2379,127.0.0.1:2381", "redis 127.0.0.1:6379",
    // "http://127.0.0.1:8080/metadata": for messages.
    virtual std::string describe() const = 0;
};

// Builds the store a connection string names, as upstream selects it:
// "etcd://h:p[,h:p...]" (also ';' between endpoints, and a string without
// "://" is an etcd endpoint list), "redis://h:p" (port 12001 when
// missing), "http://h:p/path". "https://" and unknown schemes throw
// Error(kErrInvalidArgument / kErrNotImplemented) naming the scheme.
// Nothing is contacted here.
std::unique_ptr<MetadataStore> make_metadata_store(const std::string &conn, const MetadataStoreOptions &opt);

}  // namespace mcrs
