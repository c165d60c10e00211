// The three metadata stores behind make_metadata_store (metadata_store.h),
// declared here for make_store.cpp and the tests; the engine uses only the
// MetadataStore interface. Also the RESP reply parser, which takes a byte
// buffer so that it can be tested and fuzzed without a socket.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/host_port.h"
#include "common/json.h"
#include "common/socket.h"
#include "metadata/http_client.h"
#include "metadata/metadata_store.h"

namespace mcrs {

// Calls to one etcd or Redis store share its connection and lease state, so
// they take turns. A call takes its turn before its own deadline or fails:
// behind a hung call it ends within its timeout, not after every call
// queued ahead of it. A lock that can give up at a deadline, built on a
// mutex and a condition variable rather than std::timed_mutex, whose
// try_lock_until goes through pthread_mutex_clocklock, a call
// ThreadSanitizer (GCC 12) does not see (it then reports every unlock).
class StoreMutex {
public:
    void lock() {
        std::unique_lock<std::mutex> g(m_);
        cv_.wait(g, [this] { return !held_; });
        held_ = true;
    }
    bool try_lock() {
        std::lock_guard<std::mutex> g(m_);
        if (held_) return false;
        held_ = true;
        return true;
    }
    template <class Clock, class Duration>
    bool try_lock_until(const std::chrono::time_point<Clock, Duration> &t) {
        std::unique_lock<std::mutex> g(m_);
        if (!cv_.wait_until(g, t, [this] { return !held_; })) return false;
        held_ = true;
        return true;
    }
    void unlock() {
        {
            std::lock_guard<std::mutex> g(m_);
            held_ = false;
        }
        cv_.notify_one();
    }

private:
    std::mutex m_;
    std::condition_variable cv_;
    bool held_ = false;
};

inline std::unique_lock<StoreMutex> lock_before(StoreMutex &mu, const IoDeadline &dl, const std::string &describe) {
    std::unique_lock<StoreMutex> lk(mu, dl.deadline);
    if (!lk.owns_lock())
        throw Error(kErrMetadata, describe + ": timed out waiting for an earlier call to the store to finish");
    return lk;
}

// ---- etcd (v3 JSON gateway) -------------------------------------------------

// Endpoints are tried in turn, starting from the last one that answered;
// one call (every endpoint, retries while a member reports it is
// unavailable) stays within timeout_ms. With lease_ttl_s > 0 every put is
// attached to one lease, kept alive by a background thread (every ttl/3
// s); a lost lease is granted again and every key this store holds put
// again. The destructor stops the thread and revokes the lease.
class EtcdStore : public MetadataStore {
public:
    EtcdStore(std::vector<HostPort> endpoints, const MetadataStoreOptions &opt);
    ~EtcdStore() override;
    EtcdStore(const EtcdStore &) = delete;
    EtcdStore &operator=(const EtcdStore &) = delete;

    bool get(const std::string &key, std::string &value) override;
    void put(const std::string &key, const std::string &value) override;
    bool remove(const std::string &key) override;
    std::string describe() const override { return describe_; }

    // Tests: stops the keep-alive thread and makes the destructor leave
    // the lease alone, as if the process had died (the keys expire after
    // the TTL).
    void simulate_crash_for_test();
    // Tests: the current lease (0: none).
    int64_t lease_id_for_test();

    // A gateway answer: 200 with its JSON, or a definite error reply (the
    // gateway's status, the gRPC code and message).
    struct Answer {
        int http_status = 0;
        int grpc_code = 0;
        std::string message;
        Json json;
    };

private:
    Answer call(const char *path, const Json &body, const IoDeadline &dl, uint64_t extra_body_bytes,
                bool first_object = false);
    IoDeadline user_deadline() const;
    void put_locked(const std::string &key, const std::string &value, const IoDeadline &dl);
    Answer put_once(const std::string &key, const std::string &value, const IoDeadline &dl);
    void grant_locked(const IoDeadline &dl);
    void regrant_locked(const IoDeadline &dl);
    void start_keepalive_locked();
    void keepalive_loop();
    void keepalive_body();
    void stop_keepalive();
    [[noreturn]] void fail(const std::string &op, const std::string &key, const Answer &a) const;

    std::vector<HostPort> endpoints_;
    MetadataStoreOptions opt_;
    std::string describe_;
    std::atomic<size_t> last_good_{0};

    StoreMutex mu_;  // serializes calls (lock_before); guards the lease state below
    int64_t lease_id_ = 0;
    bool need_regrant_ = false;  // a renewal did not finish: grant and put again
    std::map<std::string, std::string> held_;  // key -> value last put (lease mode)
    bool crashed_ = false;

    std::condition_variable_any cv_;
    std::atomic<bool> stop_{false};
    WakePipe wake_;  // cancels the keep-alive thread's I/O at shutdown
    std::thread keepalive_;
};

// ---- Redis (RESP2) ----------------------------------------------------------

struct RespReply {
    enum class Type { Simple, Error, Integer, Bulk, Nil, Array };
    Type type = Type::Nil;
    std::string str;  // Simple, Error, Bulk
    int64_t integer = 0;
    std::vector<RespReply> elems;  // Array
};

struct RespLimits {
    uint64_t max_bulk_bytes = 32ull << 20;
    size_t max_line_bytes = 64 * 1024;
    size_t max_array_elems = 64;
    int max_depth = 4;
};

// Parses the reply at the start of `buf`: 0 when more bytes are needed,
// otherwise the bytes it took (`out` set). Throws Error(kErrMetadata,
// "malformed reply from redis <server>: ...") for anything that is not a
// RESP2 reply within the limits (checked as soon as a header is visible).
size_t parse_resp_reply(std::string_view buf, const RespLimits &limits, const std::string &server,
                        RespReply &out);

// One connection, opened on first use (AUTH and SELECT as configured);
// a call that finds it broken reconnects and resends once. With
// lease_ttl_s > 0 values are SET with EX and a background thread renews
// them (EXPIRE, SET again when the key is gone); the destructor deletes
// the keys that still hold what this store put.
class RedisStore : public MetadataStore {
public:
    RedisStore(std::string host, uint16_t port, const MetadataStoreOptions &opt);
    ~RedisStore() override;
    RedisStore(const RedisStore &) = delete;
    RedisStore &operator=(const RedisStore &) = delete;

    bool get(const std::string &key, std::string &value) override;
    void put(const std::string &key, const std::string &value) override;
    bool remove(const std::string &key) override;
    std::string describe() const override { return describe_; }

    // Tests: as EtcdStore::simulate_crash_for_test (keys expire after the TTL).
    void simulate_crash_for_test();

private:
    RespReply call(const std::vector<std::string> &args, const IoDeadline &dl);
    RespReply roundtrip(const std::vector<std::string> &args, const IoDeadline &dl);
    void connect_locked(const IoDeadline &dl);
    IoDeadline user_deadline() const;
    void set_locked(const std::string &key, const std::string &value, const IoDeadline &dl);
    void refresh_locked(const IoDeadline &dl);
    void keepalive_loop();
    void keepalive_body();
    void stop_keepalive();

    std::string host_;
    uint16_t port_;
    MetadataStoreOptions opt_;
    std::string server_;  // "host:port"
    std::string describe_;
    RespLimits limits_;

    StoreMutex mu_;  // serializes calls (lock_before); guards the connection and the keys below
    Fd conn_;
    std::string rbuf_;
    std::map<std::string, std::string> held_;  // key -> value last put (lease mode)
    bool crashed_ = false;

    std::condition_variable_any cv_;
    std::atomic<bool> stop_{false};
    WakePipe wake_;
    std::thread keepalive_;
};

// ---- HTTP metadata server ---------------------------------------------------

// Upstream's protocol: GET/PUT/DELETE <url>?key=<escaped key>; 200 is a
// value (or success), 404 "no such key".
class HttpStore : public MetadataStore {
public:
    HttpStore(std::string url, const MetadataStoreOptions &opt);

    bool get(const std::string &key, std::string &value) override;
    void put(const std::string &key, const std::string &value) override;
    bool remove(const std::string &key) override;
    std::string describe() const override { return url_; }

    // "<path>?key=<escaped>" for `key` (tests).
    std::string target_for(const std::string &key) const;

private:
    HttpResponse request(const char *method, const std::string &key, const std::string *body);
    [[noreturn]] void fail(const char *op, const std::string &key, const HttpResponse &r) const;

    const std::string url_;
    const HttpUrl parsed_;
    const MetadataStoreOptions opt_;
};

}  // namespace mcrs
