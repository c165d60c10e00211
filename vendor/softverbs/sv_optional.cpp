// Entry points that old libibverbs versions lack. The legacy build of the
// stand-in (libmc_softverbs_legacy.so) leaves this file out, so tests can
// check that the loader copes without them.
#include "sv_state.h"

using namespace sv;

SV_EXPORT ibv::mr *ibv_reg_mr_iova2(ibv::pd *pd, void *addr, size_t length, uint64_t iova,
                                    unsigned int access) {
    return register_mr(pd, addr, length, iova, static_cast<int>(access), true, false, -1, 0);
}

SV_EXPORT ibv::mr *ibv_reg_mr_iova(ibv::pd *pd, void *addr, size_t length, uint64_t iova, int access) {
    return register_mr(pd, addr, length, iova, access, true, false, -1, 0);
}

// The stand-in cannot map a dmabuf: it records fd/offset and treats the
// iova as the CPU address of the memory.
SV_EXPORT ibv::mr *ibv_reg_dmabuf_mr(ibv::pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                     int access) {
    if (fd < 0) return fail_null<ibv::mr>(EBADF);
    return register_mr(pd, reinterpret_cast<void *>(static_cast<uintptr_t>(iova)), length, iova, access,
                       true, true, fd, offset);
}

SV_EXPORT int ibv_fork_init(void) { return 0; }
