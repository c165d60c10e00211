// The batch side of the engine: allocating batches, validating and routing
// submitted requests (the one place a request's route is decided),
// copies within our own segment, and reading statuses back.
#include <cstring>
#include <unordered_map>

#include "common/error.h"
#include "common/host_port.h"
#include "common/log.h"
#include "common/range.h"
#include "common/text.h"
#include "engine/identity.h"
#include "engine/transfer_engine.h"
#include "gpu/gpu.h"
#include "transport/ipc/ipc_transport.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/samehost/samehost_client.h"
#include "transport/tcp/tcp_client.h"
#include "transport/transport.h"

namespace mcrs {

namespace {

// Per-thread scratch of a submit, emptied whenever the submit leaves (its
// items hold pins on local memory and references to their batch). Up to
// 16 MiB per vector is kept: a KV pull of a long prompt (100k+ requests)
// reuses it instead of faulting fresh pages in on every submit, while one
// huge batch does not tie its memory to the thread for good.
void release_scratch(std::vector<TransferItem> &v) {
    constexpr size_t kKeep = (16u << 20) / sizeof(TransferItem);
    v.clear();
    if (v.capacity() > kKeep) std::vector<TransferItem>().swap(v);
}

}  // namespace

uint64_t TransferEngine::allocate_batch(size_t capacity) {
    // Capacity 0 is a valid (empty) batch, as upstream: every submit of
    // one request or more to it is refused with TooManyRequests.
    if (capacity > (1u << 24))
        throw Error(kErrInvalidArgument,
                    "batch capacity " + std::to_string(capacity) + " exceeds the limit of 16777216");
    return batches_.create(capacity)->id();
}

std::shared_ptr<Batch> TransferEngine::batch_or_throw(uint64_t id) const {
    auto b = batches_.find(id);
    if (!b) throw StatusError(kStatusInvalidArgument, "unknown batch id " + std::to_string(id));
    return b;
}

static StatusError too_many_requests(const Batch &batch, size_t n) {
    return StatusError(kStatusTooManyRequests, "batch " + std::to_string(batch.id()) + " holds " +
                                                   std::to_string(batch.submitted()) + " of " +
                                                   std::to_string(batch.capacity()) + " tasks; " +
                                                   std::to_string(n) + " more do not fit");
}

void TransferEngine::check_room(uint64_t batch_id, size_t n) const {
    auto batch = batch_or_throw(batch_id);
    if (n > batch->capacity() - batch->submitted()) throw too_many_requests(*batch, n);
}

void TransferEngine::submit(uint64_t batch_id, const Request *reqs, size_t n,
                            const PendingNotify *notify) {
    auto batch = batch_or_throw(batch_id);
    if (n == 0) {
        if (notify) throw StatusError(kStatusInvalidArgument, "a notify needs at least one request");
        return;
    }
    if (!reqs) throw StatusError(kStatusInvalidArgument, "request array is null");
    auto too_many = [&]() { return too_many_requests(*batch, n); };
    if (n > batch->capacity() - batch->submitted()) throw too_many();

    // Per-thread scratch, so that a submit allocates nothing once warm. It
    // is emptied on every exit: items hold pins on local memory.
    thread_local std::vector<TransferItem> items;
    thread_local std::vector<TransferItem> group;
    thread_local std::vector<Target> descs;
    struct Scrub {
        ~Scrub() {
            release_scratch(items);
            release_scratch(group);
            descs.clear();
        }
    } scrub;
    items.resize(n);

    // Validate everything before reserving slots, so a bad request leaves
    // the batch untouched.
    bool one_target = true;
    for (size_t i = 0; i < n; ++i) {
        if (i > 0 && reqs[i].target_id != reqs[0].target_id) one_target = false;
        prepare_item(reqs[i], i, descs, items[i], i > 0 ? &items[i - 1].local_pin : nullptr);
    }
    auto first = batch->reserve(n);
    if (!first) throw too_many();
    tasks_submitted_.fetch_add(n, std::memory_order_relaxed);
    if (notify) batch->set_notify(*notify);
    for (size_t i = 0; i < n; ++i) {
        items[i].batch = batch;
        items[i].task = *first + i;
    }

    // Hand each target's requests to its transport, in request order.
    if (one_target) dispatch(reqs[0].target_id, items, descs);
    else dispatch_by_target(reqs, items, group, descs);
}

void TransferEngine::prepare_item(const Request &r, size_t i, std::vector<Target> &targets, TransferItem &it,
                                  const RegionPin *prev) {
    auto where = [i]() { return "request " + std::to_string(i) + ": "; };
    if (r.opcode != kOpRead && r.opcode != kOpWrite)
        throw StatusError(kStatusInvalidArgument,
                          where() + "opcode " + std::to_string(r.opcode) + " is neither READ nor WRITE");
    if (r.length == 0) throw StatusError(kStatusInvalidArgument, where() + "length is zero");
    if (!r.source) throw StatusError(kStatusInvalidArgument, where() + "source is null");
    uint64_t src = reinterpret_cast<uint64_t>(r.source);
    if (src + r.length < src || r.target_offset + r.length < r.target_offset)
        throw StatusError(kStatusInvalidArgument,
                          where() + "range of " + std::to_string(r.length) + " bytes wraps around");
    bool known = r.target_id == kLocalSegment;
    for (const auto &t : targets) known = known || t.id == r.target_id;
    if (!known) targets.push_back(make_target(r.target_id, where()));
    // KV blocks come in runs from one registered cache: the previous
    // request's region usually holds this one too. Sharing skips the
    // registry, so a request may still pin a region whose unregister has
    // begun but not returned (it waits for this pin too): the same outcome
    // as a lookup made just before the unregister.
    RegionPin pin = prev && *prev && range_within(src, r.length, prev->region()->addr, prev->region()->length)
                        ? prev->share()
                        : registry_.pin(src, r.length, /*need_remote=*/false);
    if (!pin)
        throw StatusError(kStatusAddressNotRegistered, where() + "local range [" + hex(src) + ", " +
                                                           hex(src + r.length) + ") is not inside one registered buffer");
    it.opcode = r.opcode;
    it.local = static_cast<char *>(r.source);
    it.remote_addr = r.target_offset;
    it.length = r.length;
    it.local_pin = std::move(pin);
}

TransferEngine::Target TransferEngine::make_target(int32_t id, const std::string &where) const {
    auto d = segments_.get(id);
    if (!d)
        throw StatusError(kStatusInvalidArgument,
                          where + "unknown segment id " + std::to_string(id) + " (open the segment first)");
    auto rdma_now = d->protocol == "rdma" ? rdma() : nullptr;
    PeerRoutes routes = peer_routes(*d, where, rdma_now != nullptr);
    if (!routes.rdma) rdma_now.reset();
    return Target{id, std::move(d), routes, std::move(rdma_now)};
}

void TransferEngine::dispatch_by_target(const Request *reqs, std::vector<TransferItem> &items,
                                        std::vector<TransferItem> &group, const std::vector<Target> &targets) {
    // One stable pass per distinct target would be O(n x targets); bucket
    // the indices by target once instead.
    std::unordered_map<int32_t, std::vector<size_t>> by_target;
    std::vector<int32_t> order;  // targets in first-seen order
    for (size_t i = 0; i < items.size(); ++i) {
        auto &bucket = by_target[reqs[i].target_id];
        if (bucket.empty()) order.push_back(reqs[i].target_id);
        bucket.push_back(i);
    }
    for (int32_t t : order) {
        group.clear();
        for (size_t i : by_target[t]) group.push_back(std::move(items[i]));
        dispatch(t, group, targets);
    }
}

PeerRoutes TransferEngine::peer_routes(const SegmentDesc &d, const std::string &where, bool rdma_now) const {
    PeerRoutes r;
    r.rdma = d.protocol == "rdma" && rdma_now;
    if (r.rdma) return r;
    // Not RDMA: the peer must be reachable over TCP (an RDMA peer counts
    // when it also publishes a TCP data port).
    if (d.protocol != "tcp" && !(d.protocol == "rdma" && d.tcp_data_port != 0))
        throw StatusError(kStatusNotSupportedTransport, where + "segment '" + d.name + "' uses protocol '" +
                                                            d.protocol + "', which this engine has not installed");
    if (!tcp_installed_.load())
        throw StatusError(kStatusNotSupportedTransport, where + "the TCP transport is not installed");
    if (d.tcp_data_port == 0)
        throw StatusError(kStatusInvalidArgument, where + "segment '" + d.name + "' advertises no TCP data port");
    bool this_host = !d.host_id.empty() && d.host_id == host_id_;
    r.cuda_ipc = ipc_ && this_host && d.process_token != process_token();
    // The owner offers the same-host transport and runs on this boot of this
    // host; its kernel-attested accept decides the rest.
    r.same_host = same_host_client_ && this_host && !d.same_host_socket.empty();
    return r;
}

Route TransferEngine::route_of(const PeerRoutes &p, const SegmentDesc &d, const TransferItem &it,
                               IpcRouteMemo &memo) const {
    if (p.rdma) return Route::Rdma;
    if (p.cuda_ipc) {
        // KV pulls name runs of blocks in one buffer: try the last one first
        // (a scan of every published buffer per request is what vLLM's one
        // buffer per layer tensor would make quadratic). Only where no two
        // handle buffers overlap is the last one also the first that holds
        // the range.
        const BufferDesc *b = d.ipc_buffers_overlap ? nullptr : memo.buffer;
        if (!b || !range_within(it.remote_addr, it.length, b->addr, b->length)) {
            b = nullptr;
            for (const auto &c : d.buffers)
                if (!c.cuda_ipc.empty() && range_within(it.remote_addr, it.length, c.addr, c.length)) {
                    b = &c;
                    break;
                }
            // Ask the IPC transport (a lock) only when the buffer changes:
            // with overlapping buffers every request scans, but runs still
            // land in the same one.
            if (b && b != memo.buffer) memo = IpcRouteMemo{b, ipc_->usable(b->cuda_ipc)};
        }
        if (b && memo.usable) return Route::CudaIpc;
    }
    // Only host memory, and only ranges inside the host buffers the owner
    // published: anything else goes over TCP, where the owner rejects what
    // it must.
    if (p.same_host && it.local_device() < 0 && d.in_host_buffer(it.remote_addr, it.length))
        return Route::SameHost;
    return Route::Tcp;
}

void TransferEngine::dispatch(int32_t target, std::vector<TransferItem> &items, const std::vector<Target> &descs) {
    if (target == kLocalSegment) {
        run_local(items);
        return;
    }
    const Target *t = nullptr;
    for (const auto &c : descs)
        if (c.id == target) t = &c;
    const std::shared_ptr<const SegmentDesc> &desc = t->desc;
    if (t->routes.rdma) {
        t->rdma->submit(desc, items);
        return;
    }
    if (!t->routes.cuda_ipc && !t->routes.same_host) {
        send_tcp(*desc, items);  // every request goes over TCP: no per-item sorting
        return;
    }
    thread_local std::vector<TransferItem> via_same, via_tcp;
    struct Scrub {  // also when a transport throws: nothing stays pinned
        ~Scrub() {
            release_scratch(via_same);
            release_scratch(via_tcp);
        }
    } scrub;
    std::vector<TransferItem> via_ipc;  // GPU-only path: allocating here is fine
    std::vector<const BufferDesc *> ipc_buffers;
    via_same.clear();
    via_tcp.clear();
    IpcRouteMemo memo;
    for (auto &it : items) {
        switch (route_of(t->routes, *desc, it, memo)) {
        case Route::CudaIpc:
            ipc_buffers.push_back(memo.buffer);
            via_ipc.push_back(std::move(it));
            break;
        case Route::SameHost: via_same.push_back(std::move(it)); break;
        default: via_tcp.push_back(std::move(it)); break;
        }
    }
    if (!via_tcp.empty()) send_tcp(*desc, via_tcp);
    if (!via_same.empty()) same_host_client_->submit(desc, via_same);
    if (!via_ipc.empty())
        ipc_->submit(desc, via_ipc, ipc_buffers,
                     [this, desc](std::vector<TransferItem> &rerouted) { send_tcp(*desc, rerouted); });
}

void TransferEngine::send_tcp(const SegmentDesc &d, std::vector<TransferItem> &items) {
    const std::string &host = d.tcp_data_host.empty() ? parse_host_port(d.name).host : d.tcp_data_host;
    int version = (d.tcp_proto_version >= 2 && cfg_.tcp_proto_version >= 2) ? 2 : 1;
    tcp_client_->submit(host, d.tcp_data_port, version, items);
}

void TransferEngine::run_local(std::vector<TransferItem> &items) {
    // kLocalSegment: the target is our own memory; same rule as for peers.
    for (auto &it : items) {
        RegionPin target = registry_.pin(it.remote_addr, it.length, /*need_remote=*/true);
        if (!target) {
            it.fail("local-segment " + std::string(it.opcode == kOpWrite ? "WRITE" : "READ") +
                    " of " + std::to_string(it.length) + " bytes at " + hex(it.remote_addr) +
                    ": not inside one registered remote-accessible buffer");
            continue;
        }
        char *t = reinterpret_cast<char *>(it.remote_addr);
        char *dst = it.opcode == kOpWrite ? t : it.local;
        const char *src = it.opcode == kOpWrite ? it.local : t;
        bool device = target.region()->device >= 0 || (it.local_pin && it.local_pin.region()->device >= 0);
        if (device) {
            // Any direction between host and GPU memory, by the copy engines;
            // between two GPUs by the direct peer path when there is one.
            int target_device = target.region()->device;
            int local_device = it.local_device();
            try {
                if (it.opcode == kOpWrite) gpu::copy_between(dst, target_device, src, local_device, it.length);
                else gpu::copy_between(dst, local_device, src, target_device, it.length);
            } catch (const Error &e) {
                it.fail(std::string("local-segment GPU copy failed: ") + e.what());
                continue;
            }
        } else {
            std::memmove(dst, src, it.length);
        }
        target.release();
        local_copies_.fetch_add(1, std::memory_order_relaxed);
        it.complete();
    }
}

void TransferEngine::maybe_send_batch_notify(Batch &b) {
    auto n = b.take_notify_if_complete();
    if (!n) return;
    try {
        send_notify(n->segment_id, n->name, n->msg);
    } catch (const Error &e) {
        MC_LOG(Warn, "notify after batch " << b.id() << " failed: " << e.what());
    }
}

int TransferEngine::task_status(uint64_t batch_id, size_t task, uint64_t *bytes) {
    auto b = batch_or_throw(batch_id);
    if (task >= b->submitted())
        throw StatusError(kStatusInvalidArgument,
                          "task " + std::to_string(task) + " of batch " + std::to_string(batch_id) +
                              " does not exist (" + std::to_string(b->submitted()) + " submitted)");
    int s = b->observe(task, bytes);
    task_status_reads_.fetch_add(1, std::memory_order_relaxed);
    if (is_terminal(s)) maybe_send_batch_notify(*b);
    return s;
}

std::string TransferEngine::task_error(uint64_t batch_id, size_t task) {
    auto b = batch_or_throw(batch_id);
    if (task >= b->submitted())
        throw StatusError(kStatusInvalidArgument, "task " + std::to_string(task) + " does not exist");
    Task &t = b->task(task);
    if (t.status.load(std::memory_order_acquire) != kTaskFailed) return std::string();
    return t.error;
}

int TransferEngine::event_fd() {
    std::string err;
    int fd = batches_.completions().enable(err);
    if (fd < 0) throw Error(kErrContext, "cannot create the engine's event fd: " + err);
    return fd;
}

bool TransferEngine::wait_batch(uint64_t batch_id, int64_t timeout_ms) {
    auto b = batch_or_throw(batch_id);
    bool done = b->wait(timeout_ms);
    if (done) {
        size_t n = b->submitted();
        for (size_t i = 0; i < n; ++i) b->observe(i, nullptr);
        maybe_send_batch_notify(*b);
    }
    return done;
}

size_t TransferEngine::batch_statuses(uint64_t batch_id, size_t start, int *status, uint64_t *bytes,
                                      size_t cap) {
    auto b = batch_or_throw(batch_id);
    size_t n = b->submitted();
    size_t end = start < n ? start + std::min(cap, n - start) : start;
    bool any_terminal = false;
    for (size_t i = start; i < end; ++i) {
        uint64_t by = 0;
        int s = b->observe(i, &by);
        if (status) status[i - start] = s;
        if (bytes) bytes[i - start] = by;
        any_terminal = any_terminal || is_terminal(s);
    }
    if (end > start) task_status_reads_.fetch_add(end - start, std::memory_order_relaxed);
    if (any_terminal) maybe_send_batch_notify(*b);
    return n;
}

void TransferEngine::free_batch(uint64_t batch_id) {
    bool found = false;
    if (batches_.erase_if_idle(batch_id, found)) return;
    if (!found) throw StatusError(kStatusInvalidArgument, "unknown batch id " + std::to_string(batch_id));
    throw StatusError(kStatusBatchBusy,
                      "batch " + std::to_string(batch_id) +
                          " still has tasks that were not seen COMPLETED or FAILED");
}

void TransferEngine::reset_batch(uint64_t batch_id) {
    auto b = batch_or_throw(batch_id);
    if (!b->reset())
        throw StatusError(kStatusBatchBusy,
                          "batch " + std::to_string(batch_id) +
                              " still has tasks that were not seen COMPLETED or FAILED");
}

}  // namespace mcrs
