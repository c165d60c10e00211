// The device set: building devices from the spec, reconfiguring, and the
// cleanup at process exit.
#include <endian.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "sv_state.h"
#include "sv_sysfs.h"

namespace sv {

Registry &registry() {
    static Registry *reg = new Registry();  // never destroyed: used until the very end
    return *reg;
}

namespace {

void put_be64(uint8_t *p, uint64_t v) {
    uint64_t be = htobe64(v);
    std::memcpy(p, &be, 8);
}

std::unique_ptr<Device> make_device(const DeviceSpec &spec, int index) {
    auto d = std::make_unique<Device>();
    d->h.impl = d.get();
    d->index = index;
    d->spec = spec;
    d->guid = 0x5356000000000000ull | static_cast<uint64_t>(index + 1);  // "SV"
    d->lid = spec.roce ? 0 : static_cast<uint16_t>(index + 1);
    d->port_state = spec.port_up ? ibv::IBV_PORT_ACTIVE : ibv::IBV_PORT_DOWN;
    for (int i = 0; i < spec.gids; ++i) {
        GidEntry g{};
        int pair = spec.roce ? i / 2 : 0;
        if (pair == 0) {
            put_be64(g.gid.raw, 0xfe80000000000000ull);
            put_be64(g.gid.raw + 8, d->guid + (spec.roce ? 0 : static_cast<uint64_t>(i)));
        } else {
            uint32_t ip = spec.ipv4 + static_cast<uint32_t>(pair - 1);
            g.gid.raw[10] = 0xff;
            g.gid.raw[11] = 0xff;
            uint32_t be = htobe32(ip);
            std::memcpy(g.gid.raw + 12, &be, 4);
        }
        g.roce_v2 = spec.roce && (i % 2 == 1);
        d->gids.push_back(g);
    }
    ibv::device &abi = d->h.abi;
    abi.node_type = ibv::IBV_NODE_CA;
    abi.transport_type = ibv::IBV_TRANSPORT_IB;
    std::snprintf(abi.name, sizeof(abi.name), "%s", spec.name.c_str());
    return d;
}

void stop_workers(std::vector<std::unique_ptr<Device>> &devs) {
    for (auto &d : devs) {
        {
            std::lock_guard<std::mutex> lock(d->qmu);
            d->stop = true;
        }
        d->qcv.notify_all();
    }
    for (auto &d : devs)
        if (d->worker.joinable()) d->worker.join();
}

int configure_locked(Registry &reg, const char *spec) {
    std::string text;
    if (spec) {
        text = spec;
    } else {
        const char *env = std::getenv("MC_SOFTVERBS_DEVICES");
        text = env ? env : kDefaultSpec;
    }
    std::vector<DeviceSpec> specs;
    std::string err;
    if (!parse_spec(text, specs, err)) {
        std::fprintf(stderr, "softverbs: bad device spec \"%s\": %s\n", text.c_str(), err.c_str());
        return EINVAL;
    }
    std::vector<std::unique_ptr<Device>> old;
    {
        std::lock_guard<std::mutex> lock(reg.mu);
        if (reg.open_contexts > 0) return EBUSY;
        old.swap(reg.devices);
        reg.configured = true;
    }
    stop_workers(old);
    std::vector<std::unique_ptr<Device>> fresh;
    for (size_t i = 0; i < specs.size(); ++i) fresh.push_back(make_device(specs[i], static_cast<int>(i)));
    std::lock_guard<std::mutex> lock(reg.mu);
    remove_sysfs(reg);
    for (auto &d : old) reg.retired.push_back(std::move(d));
    reg.injections.clear();
    reg.owner_pid = getpid();
    std::string why = build_sysfs(reg, fresh);
    if (!why.empty()) {
        std::fprintf(stderr, "softverbs: cannot build the fake sysfs: %s\n", why.c_str());
        return EIO;
    }
    for (auto &d : fresh) d->worker = std::thread(worker_loop, d.get());
    reg.devices.swap(fresh);
    return 0;
}

}  // namespace

int configure(const char *spec) {
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.config_mu);
    return configure_locked(reg, spec);
}

void ensure_configured() {
    Registry &reg = registry();
    {
        std::lock_guard<std::mutex> lock(reg.mu);
        if (reg.configured) return;
    }
    std::lock_guard<std::mutex> lock(reg.config_mu);
    bool done;
    {
        std::lock_guard<std::mutex> l2(reg.mu);
        done = reg.configured;
    }
    if (!done) configure_locked(reg, nullptr);
}

void shutdown() {
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.config_mu);
    // A forked child that exits has no workers to join and must not remove
    // its parent's sysfs tree.
    if (reg.owner_pid != getpid()) return;
    std::vector<Device *> devs;
    {
        std::lock_guard<std::mutex> l2(reg.mu);
        for (auto &d : reg.devices) devs.push_back(d.get());
    }
    for (Device *d : devs) {
        {
            std::lock_guard<std::mutex> l3(d->qmu);
            d->stop = true;
        }
        d->qcv.notify_all();
    }
    for (Device *d : devs)
        if (d->worker.joinable()) d->worker.join();
    std::lock_guard<std::mutex> l2(reg.mu);
    remove_sysfs(reg);
}

Device *find_device(const std::string &name) {
    for (auto &d : registry().devices)
        if (d->spec.name == name) return d.get();
    return nullptr;
}

void push_async_event(Context *ctx, const ibv::async_event &ev) {
    {
        std::lock_guard<std::mutex> lock(ctx->evmu);
        ctx->events.push_back(ev);
    }
    uint64_t one = 1;
    ssize_t n = write(ctx->h.abi.async_fd, &one, sizeof(one));
    (void)n;  // an eventfd write only fails on counter overflow
}

void raise_device_event(Device *dev, ibv::event_type type) {
    ibv::async_event ev{};
    ev.element.port_num = 1;
    ev.event_type = type;
    for (Context *c : dev->contexts) push_async_event(c, ev);
}

// Like hardware: only the state the device sees changes; qp->state, which
// libibverbs updates in ibv_modify_qp alone, keeps its old value.
void set_qp_error(Qp *q) { q->state.store(ibv::IBV_QPS_ERR); }

}  // namespace sv

// Joins the workers and removes the fake sysfs when the process exits.
__attribute__((destructor)) static void softverbs_at_exit() { sv::shutdown(); }
