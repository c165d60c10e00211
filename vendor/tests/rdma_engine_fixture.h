// Helpers for tests running RDMA engines over softverbs in one process:
// env overrides, engine configs on 127.0.0.1, one-request transfers and
// the stand-in's per-device counters.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "engine/transfer_engine.h"
#include "softverbs_fixture.h"

namespace rdmatest {

using mcrs::EngineConfig;
using mcrs::TransferEngine;

// Sets (v non-null) or unsets an env variable for a scope.
struct EnvGuard {
    std::string name;
    std::string old;
    bool had = false;
    EnvGuard(const char *n, const char *v) : name(n) {
        const char *o = std::getenv(n);
        had = o != nullptr;
        if (o) old = o;
        if (v)
            setenv(n, v, 1);
        else
            unsetenv(n);
    }
    ~EnvGuard() {
        if (had)
            setenv(name.c_str(), old.c_str(), 1);
        else
            unsetenv(name.c_str());
    }
    EnvGuard(const EnvGuard &) = delete;
    EnvGuard &operator=(const EnvGuard &) = delete;
};

inline EngineConfig rdma_cfg(std::vector<std::string> allow, uint32_t protocols = mcrs::kProtoRdma) {
    EngineConfig c = EngineConfig::from_env();
    c.local_server_name = "127.0.0.1";
    c.bind_address = "127.0.0.1";
    c.protocols = protocols;
    c.device_allow_list = std::move(allow);
    c.handshake_timeout_ms = 3000;
    return c;
}

// Runs one request, returns its status (and the error text in *why).
inline int run_one(TransferEngine &e, int32_t seg, int opcode, void *local, uint64_t remote, uint64_t len,
                   std::string *why = nullptr) {
    uint64_t b = e.allocate_batch(1);
    mcrs::Request r{};
    r.opcode = opcode;
    r.source = local;
    r.target_id = seg;
    r.target_offset = remote;
    r.length = len;
    e.submit(b, &r, 1, nullptr);
    e.wait_batch(b, 20000);
    uint64_t bytes = 0;
    int st = e.task_status(b, 0, &bytes);
    if (why) *why = e.task_error(b, 0);
    e.free_batch(b);
    return st;
}

inline mc_softverbs_counters sv_counters(const char *dev) {
    mc_softverbs_counters c{};
    svtest::sv().get_counters(dev, &c);
    return c;
}

// Successful WRs `dev` executed as requester.
inline uint64_t sv_wrs(const char *dev) {
    mc_softverbs_counters c = sv_counters(dev);
    return c.wrs_executed - c.wrs_failed;
}

// Successful WRs `dev` served as responder.
inline uint64_t sv_served(const char *dev) { return sv_counters(dev).served_wrs; }

struct Pair {
    std::unique_ptr<TransferEngine> a, b;
    int32_t seg = -1;
};

inline Pair make_pair_engines(std::vector<std::string> allow_a, std::vector<std::string> allow_b) {
    Pair p;
    p.a = std::make_unique<TransferEngine>(rdma_cfg(std::move(allow_a)));
    p.b = std::make_unique<TransferEngine>(rdma_cfg(std::move(allow_b)));
    return p;
}

}  // namespace rdmatest
