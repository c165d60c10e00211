// Protection domains and memory regions (keys, bounds, access flags), and
// the EFAULT knob that imitates a GPU buffer without nvidia-peermem.
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "sv_state.h"

using namespace sv;

namespace {

constexpr int kMandatoryAccess = ibv::IBV_ACCESS_LOCAL_WRITE | ibv::IBV_ACCESS_REMOTE_WRITE |
                                 ibv::IBV_ACCESS_REMOTE_READ | ibv::IBV_ACCESS_REMOTE_ATOMIC |
                                 (1 << 4) /* MW_BIND */ | (1 << 7) /* HUGETLB */;

bool overlaps_efault(const Registry &reg, uint64_t begin, uint64_t end) {
    for (const auto &r : reg.efault)
        if (begin < r.second && r.first < end) return true;
    return false;
}

}  // namespace

SV_EXPORT ibv::pd *ibv_alloc_pd(ibv::context *context) {
    Context *ctx = impl_of<Context>(context);
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    auto *p = new Pd();
    p->h.impl = p;
    p->ctx = ctx;
    p->h.abi.context = context;
    static uint32_t next_handle = 1;
    p->h.abi.handle = next_handle++;
    ctx->pds.insert(p);
    return &p->h.abi;
}

SV_EXPORT int ibv_dealloc_pd(ibv::pd *pd) {
    Pd *p = impl_of<Pd>(pd);
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    if (p->refs > 0) return EBUSY;  // MRs or QPs still use it
    p->ctx->pds.erase(p);
    delete p;
    return 0;
}

namespace sv {

// A DMA-BUF fd links to "/dmabuf:<name>" (Linux >= 5.x) or
// "anon_inode:dmabuf" (older kernels).
static bool fd_names_dmabuf(int fd) {
    char link[64], target[256];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return false;
    target[n] = 0;
    return std::strstr(target, "dmabuf") != nullptr;
}

ibv::mr *register_mr(ibv::pd *pd, void *host, size_t length, uint64_t iova, int access,
                     bool optional_ok, bool dmabuf, int fd, uint64_t offset) {
    Pd *p = impl_of<Pd>(pd);
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    Device *dev = p->ctx->dev;
    int known = kMandatoryAccess | (optional_ok ? static_cast<int>(ibv::IBV_ACCESS_OPTIONAL_RANGE) : 0);
    if (access & ~known) return fail_null<ibv::mr>(EINVAL);
    // Remote write or atomic access without local write is invalid in verbs.
    if ((access & (ibv::IBV_ACCESS_REMOTE_WRITE | ibv::IBV_ACCESS_REMOTE_ATOMIC)) &&
        !(access & ibv::IBV_ACCESS_LOCAL_WRITE))
        return fail_null<ibv::mr>(EINVAL);
    if (length == 0 || length > dev->spec.max_mr_size) return fail_null<ibv::mr>(EINVAL);
    uint64_t begin = reinterpret_cast<uintptr_t>(host);
    if (!host || begin + length < begin) return fail_null<ibv::mr>(EFAULT);
    if (!dmabuf && overlaps_efault(reg, begin, begin + length)) return fail_null<ibv::mr>(EFAULT);
    auto m = std::make_shared<Mr>();
    m->h.impl = m.get();
    m->ctx = p->ctx;
    m->pd = p;
    m->iova = iova;
    m->length = length;
    m->host = static_cast<char *>(host);
    m->access = access;
    m->dmabuf = dmabuf;
    m->fd = fd;
    m->fd_is_dmabuf = dmabuf && fd_names_dmabuf(fd);
    m->offset = offset;
    uint32_t counter = dev->next_key++;
    m->serial = counter;
    uint32_t lkey = (static_cast<uint32_t>(dev->index & 0xff) << 24) | ((counter << 1) & 0xfffffe);
    ibv::mr &abi = m->h.abi;
    abi.context = pd->context;
    abi.pd = pd;
    abi.addr = dmabuf ? reinterpret_cast<void *>(static_cast<uintptr_t>(iova)) : host;
    abi.length = length;
    abi.handle = counter;
    abi.lkey = lkey;
    abi.rkey = lkey | 1;  // distinct from lkey, so a swapped key is caught
    dev->by_lkey[abi.lkey] = m;
    dev->by_rkey[abi.rkey] = m;
    ++p->refs;
    return &abi;
}

void drop_mr(Mr *m) {
    Device *dev = m->ctx->dev;
    --m->pd->refs;
    uint32_t rkey = m->h.abi.rkey;
    std::shared_ptr<Mr> keep = dev->by_lkey[m->h.abi.lkey];
    dev->by_lkey.erase(m->h.abi.lkey);
    dev->by_rkey.erase(rkey);
}

}  // namespace sv

SV_EXPORT ibv::mr *ibv_reg_mr(ibv::pd *pd, void *addr, size_t length, int access) {
    return register_mr(pd, addr, length, reinterpret_cast<uintptr_t>(addr), access, false, false, -1, 0);
}

SV_EXPORT int ibv_dereg_mr(ibv::mr *mr) {
    Mr *m = impl_of<Mr>(mr);
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    drop_mr(m);
    return 0;
}
