// The object model of softverbs. Every verbs object handed to the
// application is the ABI struct inside a Handle, so the pointer the
// application passes back leads to our implementation object.
//
// Locking: one process-wide mutex (Registry::mu) guards the object graph,
// QP state changes, MR tables, faults and counters; WR execution runs under
// it, so deregistration can never race a copy. Below it, in this order:
// Qp::post_mu (posting and send-queue accounting), Device::qmu (the work
// queue), Cq::mu (completions), Channel::mu and Context::evmu (events).
// poll_cq and post_send never take Registry::mu.
#pragma once

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "softverbs_control.h"
#include "sv_config.h"
#include "transport/rdma/verbs_abi.h"

namespace sv {

namespace ibv = mcrs::ibv;

// The ABI struct first, so a pointer to it is a pointer to the Handle.
template <class Abi, class Impl>
struct Handle {
    Abi abi;
    Impl *impl;
};

template <class Impl, class Abi>
Impl *impl_of(Abi *abi) {
    return abi ? reinterpret_cast<Handle<Abi, Impl> *>(abi)->impl : nullptr;
}

struct Device;
struct Context;
struct Qp;

struct GidEntry {
    ibv::gid gid;
    bool roce_v2 = false;
};

struct Pd {
    Handle<ibv::pd, Pd> h{};
    Context *ctx = nullptr;
    int refs = 0;  // MRs and QPs on it
};

struct Mr {
    Handle<ibv::mr, Mr> h{};
    Context *ctx = nullptr;
    Pd *pd = nullptr;
    uint64_t iova = 0;    // start of the MR in the address space WRs use
    uint64_t length = 0;
    char *host = nullptr; // CPU address of iova
    int access = 0;
    bool dmabuf = false;
    int fd = -1;
    bool fd_is_dmabuf = false;  // checked at registration (find_mr reports it)
    uint64_t offset = 0;
    uint32_t serial = 0;        // registration order on the device (newest wins)
};

struct Channel {
    Handle<ibv::comp_channel, Channel> h{};
    Context *ctx = nullptr;
    int fd = -1;  // eventfd, one count per queued event
    int cqs = 0;  // CQs using it (under Registry::mu)
    std::mutex mu;
    std::deque<struct Cq *> events;  // null: the CQ was destroyed
};

struct Cqe {
    ibv::wc wc;
    std::shared_ptr<Qp> qp;
    uint64_t seq = 0;
    uint32_t epoch = 0;
};

struct Cq {
    Handle<ibv::cq, Cq> h{};
    Context *ctx = nullptr;
    Channel *channel = nullptr;
    int capacity = 0;
    int qps = 0;  // QPs using it (under Registry::mu)
    std::mutex mu;
    std::deque<Cqe> entries;
    bool armed = false;
    bool overrun = false;
};

struct Qp : std::enable_shared_from_this<Qp> {
    Handle<ibv::qp, Qp> h{};
    Device *dev = nullptr;
    Context *ctx = nullptr;
    Pd *pd = nullptr;
    Cq *scq = nullptr;
    Cq *rcq = nullptr;
    uint32_t num = 0;
    ibv::qp_cap cap{};
    bool sig_all = false;
    // Under Registry::mu (state is also read lock-free by post_send).
    std::atomic<int> state{ibv::IBV_QPS_RESET};
    bool destroyed = false;
    uint8_t port = 0;
    uint16_t pkey_index = 0;
    unsigned int access = 0;
    int path_mtu = 0;
    uint32_t dest_qpn = 0;
    ibv::ah_attr av{};
    uint32_t rq_psn = 0, sq_psn = 0;
    uint8_t timeout = 0, retry_cnt = 0, rnr_retry = 0, min_rnr_timer = 0;
    uint8_t max_rd_atomic = 0, max_dest_rd_atomic = 0;
    // Send queue accounting (under post_mu): a slot stays used until a
    // completion at or after it is polled, as on hardware.
    std::mutex post_mu;
    uint64_t posted = 0;
    uint64_t freed = 0;
    std::atomic<uint32_t> epoch{0};  // bumped by RESET: older WRs vanish
};

struct Work {
    std::shared_ptr<Qp> qp;
    uint64_t seq = 0;
    uint32_t epoch = 0;
    uint64_t wr_id = 0;
    int opcode = 0;
    unsigned int flags = 0;
    std::vector<ibv::sge> sges;
    std::vector<char> inline_data;
    bool is_inline = false;
    uint64_t remote_addr = 0;
    uint32_t rkey = 0;
};

struct Context {
    Handle<ibv::context, Context> h{};
    Device *dev = nullptr;
    // What the context owns (under Registry::mu); closing the device frees
    // whatever the application left, as the kernel does on close.
    std::unordered_set<Pd *> pds;
    std::unordered_set<Cq *> cqs;
    std::unordered_set<Channel *> channels;
    std::mutex evmu;
    std::deque<ibv::async_event> events;
};

struct Device {
    Handle<ibv::device, Device> h{};
    int index = 0;
    DeviceSpec spec;
    uint64_t guid = 0;
    uint16_t lid = 0;
    std::vector<GidEntry> gids;
    std::string ibdev_dir;  // real directory behind ibdev_path
    // Under Registry::mu.
    int port_state = ibv::IBV_PORT_ACTIVE;
    std::vector<Context *> contexts;
    std::unordered_map<uint32_t, std::shared_ptr<Mr>> by_lkey, by_rkey;
    std::unordered_map<uint32_t, std::shared_ptr<Qp>> qps;
    uint32_t next_key = 1;
    mc_softverbs_counters counters{};
    // The worker that executes WRs, in post order.
    std::mutex qmu;
    std::condition_variable qcv;
    std::deque<Work> queue;
    bool stop = false;
    bool paused = false;
    int drop_completions = 0;  // successful WRs whose CQE is lost (Registry::mu)
    bool busy = false;  // the worker holds a WR taken from the queue
    std::thread worker;
};

struct Injection {
    Device *dev = nullptr;
    Device *peer = nullptr;  // null: any peer
    int remaining = 0;
    int status = 0;
};

struct Registry {
    std::mutex mu;
    std::mutex config_mu;  // serialises configure()
    bool configured = false;
    std::vector<std::unique_ptr<Device>> devices;
    std::vector<std::unique_ptr<Device>> retired;  // old configs: pointers stay readable
    int owner_pid = 0;  // the process whose workers and sysfs these are
    std::string sysfs_root;
    bool sysfs_root_created = false;
    int open_contexts = 0;
    uint32_t next_qpn = 0x100;
    std::vector<Injection> injections;
    std::vector<std::pair<uint64_t, uint64_t>> efault;  // [begin, end)
};

// The process-wide registry, configured from the env on first use.
Registry &registry();
// Configures from the env unless done; call before touching devices.
void ensure_configured();
// Replaces the device set; returns 0 or an errno value.
int configure(const char *spec);
// Stops the workers and removes the fake sysfs (at exit).
void shutdown();

// Helpers used across files (all need Registry::mu held).
Device *find_device(const std::string &name);
void push_async_event(Context *ctx, const ibv::async_event &ev);
void raise_device_event(Device *dev, ibv::event_type type);
void set_qp_error(Qp *q);
// Worker entry point (sv_exec.cpp).
void worker_loop(Device *dev);
// Adds a completion (needs Registry::mu); false if the CQ overflowed.
bool push_completion(Cq *cq, const Cqe &e);
// Frees a QP / MR / CQ / channel (Registry::mu held, no checks).
void drop_qp(Qp *q);
void drop_mr(Mr *m);
void free_cq(Cq *c);
void free_channel(Channel *ch);

// Registers [iova, iova + length) backed by CPU memory at `host` (the
// ibv_reg_mr* and ibv_reg_dmabuf_mr exports all end here).
ibv::mr *register_mr(ibv::pd *pd, void *host, size_t length, uint64_t iova, int access,
                     bool optional_ok, bool dmabuf, int fd, uint64_t offset);

// The data-path verbs behind context->ops.
int op_post_send(ibv::qp *qp, ibv::send_wr *wr, ibv::send_wr **bad_wr);
int op_post_recv(ibv::qp *qp, ibv::recv_wr *wr, ibv::recv_wr **bad_wr);
int op_poll_cq(ibv::cq *cq, int num_entries, ibv::wc *wc);
int op_req_notify_cq(ibv::cq *cq, int solicited_only);

// errno-style return helpers.
template <class T>
T *fail_null(int err) {
    errno = err;
    return nullptr;
}

}  // namespace sv

// Exports use C linkage and default visibility; everything else is hidden.
#define SV_EXPORT extern "C" __attribute__((visibility("default")))
