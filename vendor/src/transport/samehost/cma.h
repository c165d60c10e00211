// Cross-memory attach (process_vm_readv/process_vm_writev) between two
// processes of this host, for the same-host CPU path. Copies loop over
// partial transfers; failures return the errno (EPERM: ptrace rules forbid
// it; ESRCH: no such process; EFAULT: a range is not mapped).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace mcrs {

// Copies `len` bytes at `remote` in process `pid` into `local`.
// Returns 0 or an errno value.
int cma_read(pid_t pid, uint64_t remote, void *local, size_t len);
// Copies `len` bytes at `local` into `remote` in process `pid`.
int cma_write(pid_t pid, uint64_t remote, const void *local, size_t len);
// One copy of a batch: `len` bytes between `local` (this process) and
// `remote` (the peer).
struct CmaPiece {
    void *local;
    uint64_t remote;
    size_t len;
};
// Copies pieces[0..n) in order, many per system call (`to_remote`: local ->
// peer, else peer -> local). Returns how many leading pieces were copied
// whole; when that is less than n, `err` holds why piece [returned] failed
// (EFAULT: a range is not mapped) and the pieces after it were not tried.
size_t cma_copy_many(pid_t pid, bool to_remote, const CmaPiece *pieces, size_t n, int &err);
// Whether the kernel lets this process attach to `pid` for copies (the
// ptrace access rules: e.g. a non-dumpable peer is refused). Probed by
// opening /proc/<pid>/mem, which applies the same check. 0 or an errno.
int cma_check_access(pid_t pid);

}  // namespace mcrs
