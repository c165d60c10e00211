// The test-only mc_softverbs_* control functions (softverbs_control.h).
#include "softverbs_control.h"

#include <cstring>

#include "sv_state.h"
#include "sv_sysfs.h"

using namespace sv;

namespace {

// Finds a device of the current configuration (Registry::mu held).
Device *lookup(const char *name) { return name ? find_device(name) : nullptr; }

void set_port(Device *d, bool up) {
    int next = up ? ibv::IBV_PORT_ACTIVE : ibv::IBV_PORT_DOWN;
    if (d->port_state == next) return;
    d->port_state = next;
    write_port_state(*d);
    raise_device_event(d, up ? ibv::IBV_EVENT_PORT_ACTIVE : ibv::IBV_EVENT_PORT_ERR);
}

void set_paused(Device *d, bool paused) {
    {
        std::lock_guard<std::mutex> lock(d->qmu);
        d->paused = paused;
    }
    d->qcv.notify_all();
}

}  // namespace

SV_EXPORT int mc_softverbs_configure(const char *spec) { return configure(spec); }

SV_EXPORT int mc_softverbs_device_count(void) {
    ensure_configured();
    std::lock_guard<std::mutex> lock(registry().mu);
    return static_cast<int>(registry().devices.size());
}

SV_EXPORT const char *mc_softverbs_sysfs_root(void) {
    ensure_configured();
    std::lock_guard<std::mutex> lock(registry().mu);
    return registry().sysfs_root.c_str();
}

SV_EXPORT int mc_softverbs_set_port_state(const char *device, int up) {
    ensure_configured();
    std::lock_guard<std::mutex> lock(registry().mu);
    Device *d = lookup(device);
    if (!d) return ENODEV;
    set_port(d, up != 0);
    return 0;
}

SV_EXPORT int mc_softverbs_set_gid(const char *device, int index, const uint8_t *gid) {
    ensure_configured();
    std::lock_guard<std::mutex> lock(registry().mu);
    Device *d = lookup(device);
    if (!d) return ENODEV;
    if (!gid || index < 0 || static_cast<size_t>(index) >= d->gids.size()) return EINVAL;
    std::memcpy(d->gids[static_cast<size_t>(index)].gid.raw, gid, 16);
    raise_device_event(d, ibv::IBV_EVENT_GID_CHANGE);
    return 0;
}

SV_EXPORT int mc_softverbs_inject_wc_error(const char *device, const char *peer_device, int count,
                                           int wc_status) {
    ensure_configured();
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    Device *d = lookup(device);
    Device *p = peer_device ? lookup(peer_device) : nullptr;
    if (!d || (peer_device && !p)) return ENODEV;
    if (count <= 0 || wc_status <= ibv::IBV_WC_SUCCESS || wc_status > ibv::IBV_WC_GENERAL_ERR) return EINVAL;
    reg.injections.push_back({d, p, count, wc_status});
    return 0;
}

SV_EXPORT int mc_softverbs_set_qp_error(const char *device, uint32_t qp_num) {
    ensure_configured();
    std::lock_guard<std::mutex> lock(registry().mu);
    Device *d = lookup(device);
    if (!d) return ENODEV;
    auto it = d->qps.find(qp_num);
    if (it == d->qps.end()) return EINVAL;
    Qp *q = it->second.get();
    set_qp_error(q);
    ibv::async_event ev{};
    ev.element.qp = &q->h.abi;
    ev.event_type = ibv::IBV_EVENT_QP_FATAL;
    push_async_event(q->ctx, ev);
    return 0;
}

SV_EXPORT int mc_softverbs_add_efault_range(uint64_t addr, uint64_t length) {
    if (length == 0 || addr + length < addr) return EINVAL;
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().efault.emplace_back(addr, addr + length);
    return 0;
}

SV_EXPORT void mc_softverbs_clear_efault_ranges(void) {
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().efault.clear();
}

SV_EXPORT int mc_softverbs_drop_completions(const char *device, int count) {
    ensure_configured();
    std::lock_guard<std::mutex> lock(registry().mu);
    Device *d = lookup(device);
    if (!d) return ENODEV;
    if (count < 0) return EINVAL;
    d->drop_completions = count;
    return 0;
}

SV_EXPORT int mc_softverbs_set_paused(const char *device, int paused) {
    ensure_configured();
    std::lock_guard<std::mutex> lock(registry().mu);
    Device *d = lookup(device);
    if (!d) return ENODEV;
    set_paused(d, paused != 0);
    return 0;
}

SV_EXPORT void mc_softverbs_reset_faults(void) {
    ensure_configured();
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    reg.injections.clear();
    reg.efault.clear();
    for (auto &d : reg.devices) {
        set_paused(d.get(), false);
        d->drop_completions = 0;
        set_port(d.get(), d->spec.port_up);
    }
}

SV_EXPORT int mc_softverbs_get_counters(const char *device, mc_softverbs_counters *out) {
    ensure_configured();
    std::lock_guard<std::mutex> lock(registry().mu);
    Device *d = lookup(device);
    if (!d || !out) return d ? EINVAL : ENODEV;
    *out = d->counters;
    return 0;
}

SV_EXPORT void mc_softverbs_reset_counters(void) {
    ensure_configured();
    std::lock_guard<std::mutex> lock(registry().mu);
    for (auto &d : registry().devices) d->counters = mc_softverbs_counters{};
}

SV_EXPORT int mc_softverbs_pending(const char *device) {
    ensure_configured();
    std::lock_guard<std::mutex> lock(registry().mu);
    Device *d = lookup(device);
    if (!d) return -ENODEV;
    std::lock_guard<std::mutex> l2(d->qmu);
    return static_cast<int>(d->queue.size()) + (d->busy ? 1 : 0);
}

SV_EXPORT int mc_softverbs_find_mr(const char *device, uint64_t addr, mc_softverbs_mr_info *out) {
    ensure_configured();
    std::lock_guard<std::mutex> lock(registry().mu);
    Device *d = lookup(device);
    if (!d || !out) return d ? EINVAL : ENODEV;
    const Mr *best = nullptr;
    for (const auto &kv : d->by_lkey) {
        const Mr *m = kv.second.get();
        if (addr >= m->iova && addr - m->iova < m->length && (!best || m->serial > best->serial)) best = m;
    }
    if (!best) return ENOENT;
    *out = mc_softverbs_mr_info{};
    out->lkey = best->h.abi.lkey;
    out->rkey = best->h.abi.rkey;
    out->length = best->length;
    out->offset = best->offset;
    out->dmabuf = best->dmabuf ? 1 : 0;
    out->fd = best->fd;
    out->fd_is_dmabuf = best->fd_is_dmabuf ? 1 : 0;
    return 0;
}
