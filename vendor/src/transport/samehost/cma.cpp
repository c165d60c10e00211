#include "transport/samehost/cma.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace mcrs {

namespace {

// The kernel caps one call at MAX_RW_COUNT; stay well below it.
constexpr size_t kMaxChunk = size_t(1) << 30;

template <class Op>
int cma_loop(uint64_t remote, char *local, size_t len, Op op) {
    size_t done = 0;
    while (done < len) {
        size_t want = len - done < kMaxChunk ? len - done : kMaxChunk;
        struct iovec l = {local + done, want};
        struct iovec r = {reinterpret_cast<void *>(remote + done), want};
        ssize_t n = op(&l, &r);
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (n == 0) return EFAULT;  // no progress: a range ended early
        done += static_cast<size_t>(n);
    }
    return 0;
}

// Under ThreadSanitizer the raw syscalls: what orders a copy with the
// owner's own accesses is a request from another process, which it cannot
// see, so its interceptors would report (and symbolize) every copy.
#if defined(__SANITIZE_THREAD__)
ssize_t vm_readv(pid_t pid, const iovec *l, const iovec *r) {
    return ::syscall(SYS_process_vm_readv, pid, l, 1UL, r, 1UL, 0UL);
}
ssize_t vm_writev(pid_t pid, const iovec *l, const iovec *r) {
    return ::syscall(SYS_process_vm_writev, pid, l, 1UL, r, 1UL, 0UL);
}
#else
ssize_t vm_readv(pid_t pid, const iovec *l, const iovec *r) { return ::process_vm_readv(pid, l, 1, r, 1, 0); }
ssize_t vm_writev(pid_t pid, const iovec *l, const iovec *r) { return ::process_vm_writev(pid, l, 1, r, 1, 0); }
#endif

}  // namespace

int cma_read(pid_t pid, uint64_t remote, void *local, size_t len) {
    return cma_loop(remote, static_cast<char *>(local), len,
                    [pid](iovec *l, iovec *r) { return vm_readv(pid, l, r); });
}

int cma_write(pid_t pid, uint64_t remote, const void *local, size_t len) {
    return cma_loop(remote, const_cast<char *>(static_cast<const char *>(local)), len,
                    [pid](iovec *l, iovec *r) { return vm_writev(pid, l, r); });
}

int cma_check_access(pid_t pid) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/mem", static_cast<int>(pid));
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    ::close(fd);
    return 0;
}

bool random_bytes(void *out, size_t len) {
    char *p = static_cast<char *>(out);
    size_t got = 0;
    while (got < len) {
        ssize_t n = ::getrandom(p + got, len - got, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            break;
        }
        got += static_cast<size_t>(n);
    }
    if (got == len) return true;
    int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    while (got < len) {
        ssize_t n = ::read(fd, p + got, len - got);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) continue;
            break;
        }
        got += static_cast<size_t>(n);
    }
    ::close(fd);
    return got == len;
}

}  // namespace mcrs
