// What an engine hands a transport: one item per transfer request, with the
// batch kept alive and the local memory pinned until the item is finished.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/batch.h"
#include "core/memory_registry.h"

namespace mcrs {

struct TransferItem {
    std::shared_ptr<Batch> batch;
    size_t task = 0;
    int opcode = 0;  // 0 READ (remote -> local), 1 WRITE (local -> remote)
    char *local = nullptr;
    uint64_t remote_addr = 0;
    uint64_t length = 0;
    RegionPin local_pin;

    void complete() {
        local_pin.release();
        batch->complete(task, length);
        batch.reset();
    }
    void fail(const std::string &why) {
        local_pin.release();
        batch->fail(task, why);
        batch.reset();
    }
    bool pending() const { return batch != nullptr; }
    // GPU ordinal of the local memory, or -1 for host memory.
    int local_device() const { return local_pin ? local_pin.region()->device : -1; }
};

}  // namespace mcrs
