// The extension C ABI (mooncake_ext.h), part two: what upstream's Python
// binding offers beside its C API (engine-allocated buffers, one-call
// synchronous transfers) and the transport report of an engine.
#include <string>

#include "capi/api_guard.h"
#include "mooncake_ext.h"

using namespace mcrs;

extern "C" {

int mc_managed_buffer_alloc(transfer_engine_t engine, size_t length, const char *location, void **out) {
    return guard_errcode("mc_managed_buffer_alloc", [&] {
        TransferEngine *e = engine_of(engine, "mc_managed_buffer_alloc");
        if (!out) throw Error(kErrInvalidArgument, "output pointer is null");
        *out = nullptr;
        *out = e->alloc_managed(length, location ? location : "*");
        return 0;
    });
}

int mc_managed_buffer_free(transfer_engine_t engine, void *addr, size_t length) {
    return guard_errcode("mc_managed_buffer_free", [&] {
        engine_of(engine, "mc_managed_buffer_free")->free_managed(addr, length);
        return 0;
    });
}

int mc_transfer_sync(transfer_engine_t engine, const char *target_segment, int opcode, void *local,
                     uint64_t remote_addr, uint64_t length) {
    return guard_errcode("mc_transfer_sync", [&] {
        TransferEngine *e = engine_of(engine, "mc_transfer_sync");
        if (!target_segment) throw Error(kErrInvalidArgument, "target segment name is null");
        if (opcode != OPCODE_READ && opcode != OPCODE_WRITE)
            throw Error(kErrInvalidArgument, "opcode " + std::to_string(opcode) +
                                                 " is neither OPCODE_READ (0) nor OPCODE_WRITE (1)");
        e->transfer_sync(target_segment, opcode, local, remote_addr, length);
        return 0;
    });
}

int mc_engine_transports(transfer_engine_t engine, uint32_t *protocols) {
    return guard_errcode("mc_engine_transports", [&] {
        TransferEngine *e = engine_of(engine, "mc_engine_transports");
        if (!protocols) throw Error(kErrInvalidArgument, "protocols pointer is null");
        *protocols = (e->has_tcp() ? MC_PROTOCOL_TCP : 0u) | (e->has_rdma() ? MC_PROTOCOL_RDMA : 0u);
        return 0;
    });
}

}  // extern "C"
