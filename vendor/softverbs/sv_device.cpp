// Device discovery, contexts, device/port/GID queries and async events.
#include <endian.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "sv_state.h"

using namespace sv;

SV_EXPORT ibv::device **ibv_get_device_list(int *num_devices) {
    ensure_configured();
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    size_t n = reg.devices.size();
    auto **list = static_cast<ibv::device **>(std::calloc(n + 1, sizeof(ibv::device *)));
    if (!list) return fail_null<ibv::device *>(ENOMEM);
    for (size_t i = 0; i < n; ++i) list[i] = &reg.devices[i]->h.abi;
    if (num_devices) *num_devices = static_cast<int>(n);
    return list;
}

SV_EXPORT void ibv_free_device_list(ibv::device **list) { std::free(list); }

SV_EXPORT const char *ibv_get_device_name(ibv::device *dev) { return dev ? dev->name : nullptr; }

SV_EXPORT ibv::context *ibv_open_device(ibv::device *device) {
    Device *dev = impl_of<Device>(device);
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    bool live = false;
    for (auto &d : reg.devices) live = live || d.get() == dev;
    if (!live) return fail_null<ibv::context>(ENODEV);  // from an older configuration
    int fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
    if (fd < 0) return nullptr;
    auto *ctx = new Context();
    ctx->h.impl = ctx;
    ctx->dev = dev;
    ibv::context &abi = ctx->h.abi;
    abi.device = device;
    abi.cmd_fd = -1;
    abi.async_fd = fd;
    abi.num_comp_vectors = 1;
    pthread_mutex_init(&abi.mutex, nullptr);
    abi.ops.post_send = op_post_send;
    abi.ops.post_recv = op_post_recv;
    abi.ops.poll_cq = op_poll_cq;
    abi.ops.req_notify_cq = op_req_notify_cq;
    dev->contexts.push_back(ctx);
    ++reg.open_contexts;
    return &abi;
}

SV_EXPORT int ibv_close_device(ibv::context *context) {
    Context *ctx = impl_of<Context>(context);
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    Device *dev = ctx->dev;
    std::vector<Qp *> qps;
    for (auto &kv : dev->qps)
        if (kv.second->ctx == ctx) qps.push_back(kv.second.get());
    for (Qp *q : qps) drop_qp(q);
    std::vector<Mr *> mrs;
    for (auto &kv : dev->by_lkey)
        if (kv.second->ctx == ctx) mrs.push_back(kv.second.get());
    for (Mr *m : mrs) drop_mr(m);
    for (Cq *c : ctx->cqs) free_cq(c);
    for (Channel *ch : ctx->channels) free_channel(ch);
    for (Pd *p : ctx->pds) delete p;
    dev->contexts.erase(std::find(dev->contexts.begin(), dev->contexts.end(), ctx));
    --reg.open_contexts;
    close(context->async_fd);
    pthread_mutex_destroy(&context->mutex);
    delete ctx;
    return 0;
}

SV_EXPORT int ibv_query_device(ibv::context *context, ibv::device_attr *a) {
    Device *dev = impl_of<Context>(context)->dev;
    const DeviceSpec &s = dev->spec;
    std::memset(a, 0, sizeof(*a));
    std::snprintf(a->fw_ver, sizeof(a->fw_ver), "softverbs-1.0");
    a->node_guid = htobe64(dev->guid);
    a->sys_image_guid = htobe64(dev->guid);
    a->max_mr_size = s.max_mr_size;
    a->page_size_cap = 0xfffffffffffff000ull;
    a->vendor_id = 0x02c9;
    a->vendor_part_id = 0x5356;
    a->max_qp = s.max_qp;
    a->max_qp_wr = s.max_qp_wr;
    a->max_sge = s.max_sge;
    a->max_sge_rd = s.max_sge;
    a->max_cq = 1 << 24;
    a->max_cqe = s.max_cqe;
    a->max_mr = 1 << 24;
    a->max_pd = 1 << 24;
    a->max_qp_rd_atom = 16;
    a->max_res_rd_atom = 16 * s.max_qp;
    a->max_qp_init_rd_atom = 16;
    a->atomic_cap = ibv::IBV_ATOMIC_HCA;
    a->max_pkeys = s.roce ? 1 : 128;
    a->local_ca_ack_delay = 16;
    a->phys_port_cnt = 1;
    return 0;
}

// The exported ibv_query_port writes the whole ibv_port_attr (the old
// "compat" layout is a prefix of it).
SV_EXPORT int ibv_query_port(ibv::context *context, uint8_t port, ibv::port_attr *a) {
    Device *dev = impl_of<Context>(context)->dev;
    if (port != 1) return EINVAL;
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    const DeviceSpec &s = dev->spec;
    std::memset(a, 0, sizeof(*a));
    a->state = static_cast<ibv::port_state>(dev->port_state);
    a->max_mtu = ibv::IBV_MTU_4096;
    a->active_mtu = static_cast<ibv::mtu>(s.active_mtu);
    a->gid_tbl_len = kGidTableLen;
    a->port_cap_flags = s.roce ? ibv::IBV_PORT_IP_BASED_GIDS : 0;
    a->max_msg_sz = 0x80000000u;
    a->pkey_tbl_len = s.roce ? 1 : 128;
    a->lid = dev->lid;
    a->sm_lid = s.roce ? 0 : 1;
    a->max_vl_num = 4;
    a->subnet_timeout = s.roce ? 0 : 18;
    a->active_width = 2;    // 4x
    a->active_speed = 32;   // EDR
    a->phys_state = dev->port_state == ibv::IBV_PORT_ACTIVE ? 5 : 3;  // LinkUp / Disabled
    a->link_layer = s.roce ? ibv::IBV_LINK_LAYER_ETHERNET : ibv::IBV_LINK_LAYER_INFINIBAND;
    return 0;
}

SV_EXPORT int ibv_query_gid(ibv::context *context, uint8_t port, int index, ibv::gid *out) {
    Device *dev = impl_of<Context>(context)->dev;
    if (port != 1 || index < 0 || index >= kGidTableLen) {
        errno = EINVAL;
        return -1;
    }
    std::memset(out, 0, sizeof(*out));  // empty entries read as zero, as in rdma-core
    std::lock_guard<std::mutex> lock(registry().mu);  // mc_softverbs_set_gid writes the table
    if (static_cast<size_t>(index) < dev->gids.size()) *out = dev->gids[static_cast<size_t>(index)].gid;
    return 0;
}

SV_EXPORT int ibv_get_async_event(ibv::context *context, ibv::async_event *event) {
    Context *ctx = impl_of<Context>(context);
    uint64_t count = 0;
    // Blocks unless the application made async_fd non-blocking.
    if (read(context->async_fd, &count, sizeof(count)) != static_cast<ssize_t>(sizeof(count))) return -1;
    std::lock_guard<std::mutex> lock(ctx->evmu);
    if (ctx->events.empty()) {
        errno = EAGAIN;
        return -1;
    }
    *event = ctx->events.front();
    ctx->events.pop_front();
    return 0;
}

SV_EXPORT void ibv_ack_async_event(ibv::async_event *) {}

// ibv_fork_init is in sv_optional.cpp (absent from the legacy build).
