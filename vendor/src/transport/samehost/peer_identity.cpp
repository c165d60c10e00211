#include "transport/samehost/peer_identity.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "common/random.h"
#include "common/log.h"
#include "transport/samehost/cma.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77  // Linux 6.5 (asm-generic/socket.h)
#endif

namespace mcrs {

namespace {

socklen_t abstract_addr(const std::string &name, sockaddr_un &a) {
    std::memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    // sun_path[0] == 0: the abstract namespace; the name is not
    // NUL-terminated, its length is in the address length.
    std::memcpy(a.sun_path + 1, name.data(), name.size());
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

// A non-blocking Unix stream socket, or an invalid Fd with `err`.
Fd unix_stream_socket(std::string &err) {
    Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) err = "socket(AF_UNIX): " + errno_string(errno);
    return fd;
}

bool peer_cred(int fd, ucred &c, std::string &why) {
    socklen_t len = sizeof c;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0 || len != sizeof c) {
        why = "SO_PEERCRED: " + errno_string(errno);
        return false;
    }
    return true;
}

int pidfd_open_sys(pid_t pid) {
#ifdef SYS_pidfd_open
    return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

}  // namespace

std::string make_samehost_socket_name() {
    unsigned char r[16];
    if (!random_bytes(r, sizeof r)) return std::string();
    static const char digits[] = "0123456789abcdef";
    std::string s = "mooncake-";
    for (unsigned char b : r) {
        s.push_back(digits[b >> 4]);
        s.push_back(digits[b & 15]);
    }
    return s;
}

Fd listen_samehost(int backlog, std::string &name_out, std::string &err) {
    for (int attempt = 0; attempt < 8; ++attempt) {
        std::string name = make_samehost_socket_name();
        if (name.empty()) {
            err = "no random bytes for the socket name";
            return Fd();
        }
        Fd fd = unix_stream_socket(err);
        if (!fd.valid()) return Fd();
        sockaddr_un a;
        socklen_t len = abstract_addr(name, a);
        if (::bind(fd.get(), reinterpret_cast<sockaddr *>(&a), len) != 0) {
            if (errno == EADDRINUSE) continue;  // someone holds it: draw another
            err = "bind: " + errno_string(errno);
            return Fd();
        }
        if (::listen(fd.get(), backlog) != 0) {
            err = "listen: " + errno_string(errno);
            return Fd();
        }
        name_out = name;
        return fd;
    }
    err = "every random socket name drawn was in use";
    return Fd();
}

Fd connect_samehost(const std::string &name, std::string &err) {
    if (!valid_samehost_socket_name(name)) {
        err = "malformed socket name";
        return Fd();
    }
    Fd fd = unix_stream_socket(err);
    if (!fd.valid()) return Fd();
    sockaddr_un a;
    socklen_t len = abstract_addr(name, a);
    // Non-blocking: a full backlog answers EAGAIN instead of a wait.
    if (::connect(fd.get(), reinterpret_cast<sockaddr *>(&a), len) != 0) {
        err = "connect: " + errno_string(errno);
        return Fd();
    }
    set_nonblocking(fd.get(), false);
    return fd;
}

bool attest_initiator(int fd, AttestedPeer &out, std::string &why) {
    ucred c{};
    if (!peer_cred(fd, c, why)) return false;
    if (c.uid != ::geteuid()) {
        why = "uid " + std::to_string(c.uid) + " is not ours";
        return false;
    }
    if (c.pid <= 0) {
        why = "the peer's pid is not visible from our PID namespace";
        return false;
    }
    if (c.pid == ::getpid()) {
        why = "the peer is this process itself";
        return false;
    }
    // The pidfd of the process that connected, straight from the socket.
    int pfd = -1;
    socklen_t len = sizeof pfd;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pfd, &len) == 0 && pfd >= 0 && len == sizeof pfd) {
        out.pidfd.reset(pfd);
    } else {
        // Older kernels: open it by number, then make sure it was not a pid
        // reused after the connecting process died (see the header).
        pfd = pidfd_open_sys(c.pid);
        if (pfd < 0) {
            why = errno == ENOSYS ? std::string("this kernel has no pidfd_open")
                                  : "pidfd_open: " + errno_string(errno);
            return false;
        }
        out.pidfd.reset(pfd);
    }
    if (!pidfd_alive(out.pidfd.get())) {
        why = "the peer process has exited";
        return false;
    }
    out.pid = c.pid;
    return true;
}

bool attest_target(int fd, std::string &why) {
    ucred c{};
    if (!peer_cred(fd, c, why)) return false;
    if (c.uid != ::geteuid()) {
        why = "the socket is held by uid " + std::to_string(c.uid) + ", not ours";
        return false;
    }
    return true;
}

bool pidfd_alive(int pidfd) {
    // A pidfd becomes readable once its process has exited.
    pollfd p{pidfd, POLLIN, 0};
    int r;
    do r = ::poll(&p, 1, 0);
    while (r < 0 && errno == EINTR);
    return r == 0;
}

}  // namespace mcrs
