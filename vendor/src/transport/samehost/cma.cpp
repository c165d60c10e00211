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
ssize_t vm_readv(pid_t pid, const iovec *l, unsigned long nl, const iovec *r, unsigned long nr) {
    return ::syscall(SYS_process_vm_readv, pid, l, nl, r, nr, 0UL);
}
ssize_t vm_writev(pid_t pid, const iovec *l, unsigned long nl, const iovec *r, unsigned long nr) {
    return ::syscall(SYS_process_vm_writev, pid, l, nl, r, nr, 0UL);
}
#else
ssize_t vm_readv(pid_t pid, const iovec *l, unsigned long nl, const iovec *r, unsigned long nr) {
    return ::process_vm_readv(pid, l, nl, r, nr, 0);
}
ssize_t vm_writev(pid_t pid, const iovec *l, unsigned long nl, const iovec *r, unsigned long nr) {
    return ::process_vm_writev(pid, l, nl, r, nr, 0);
}
#endif

// iovec pairs per call (the kernel's UIO_MAXIOV is 1024).
constexpr size_t kMaxIov = 1024;

}  // namespace

int cma_read(pid_t pid, uint64_t remote, void *local, size_t len) {
    return cma_loop(remote, static_cast<char *>(local), len,
                    [pid](iovec *l, iovec *r) { return vm_readv(pid, l, 1, r, 1); });
}

int cma_write(pid_t pid, uint64_t remote, const void *local, size_t len) {
    return cma_loop(remote, const_cast<char *>(static_cast<const char *>(local)), len,
                    [pid](iovec *l, iovec *r) { return vm_writev(pid, l, 1, r, 1); });
}

size_t cma_copy_many(pid_t pid, bool to_remote, const CmaPiece *pieces, size_t n, int &err) {
    err = 0;
    struct iovec l[kMaxIov], r[kMaxIov];
    size_t i = 0;
    while (i < n) {
        // A run of pieces for one call: at most kMaxIov of them and
        // kMaxChunk bytes. A piece larger than that goes alone, looped.
        // Ranges that continue the previous one on their side share its
        // iovec: the kernel pins a remote iovec's pages in batches, so a
        // scattered list whose other side is contiguous costs one range.
        size_t cnt = 0, bytes = 0, nl = 0, nr = 0;
        while (i + cnt < n && nl < kMaxIov && nr < kMaxIov && pieces[i + cnt].len <= kMaxChunk - bytes) {
            const CmaPiece &p = pieces[i + cnt];
            char *lp = static_cast<char *>(p.local);
            if (nl > 0 && static_cast<char *>(l[nl - 1].iov_base) + l[nl - 1].iov_len == lp)
                l[nl - 1].iov_len += p.len;
            else
                l[nl++] = {lp, p.len};
            if (nr > 0 && reinterpret_cast<uint64_t>(r[nr - 1].iov_base) + r[nr - 1].iov_len == p.remote)
                r[nr - 1].iov_len += p.len;
            else
                r[nr++] = {reinterpret_cast<void *>(p.remote), p.len};
            bytes += p.len;
            ++cnt;
        }
        if (cnt == 0) {
            const CmaPiece &p = pieces[i];
            int e = to_remote ? cma_write(pid, p.remote, p.local, p.len) : cma_read(pid, p.remote, p.local, p.len);
            if (e != 0) {
                err = e;
                return i;
            }
            ++i;
            continue;
        }
        ssize_t got = to_remote ? vm_writev(pid, l, nl, r, nr) : vm_readv(pid, l, nl, r, nr);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) got = 0;  // nothing moved: the first piece says why below
        // Whole pieces covered by the count are done. The kernel stops at
        // the first bad range; that piece is redone alone, which either
        // finishes it (a transient short copy) or yields its errno.
        size_t left = static_cast<size_t>(got);
        size_t k = 0;
        while (k < cnt && left >= pieces[i + k].len) left -= pieces[i + k++].len;
        i += k;
        if (k == cnt) continue;
        const CmaPiece &p = pieces[i];
        int e = to_remote ? cma_write(pid, p.remote + left, static_cast<char *>(p.local) + left, p.len - left)
                          : cma_read(pid, p.remote + left, static_cast<char *>(p.local) + left, p.len - left);
        if (e != 0) {
            err = e;
            return i;
        }
        ++i;
    }
    return n;
}

int cma_check_access(pid_t pid) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/mem", static_cast<int>(pid));
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    ::close(fd);
    return 0;
}


}  // namespace mcrs
