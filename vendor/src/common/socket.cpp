#include "common/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "common/error.h"
#include "common/host_port.h"

namespace mcrs {

void Fd::reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
}

std::string errno_string(int err) {
    char buf[128];
    // GNU strerror_r returns a char*.
    const char *s = strerror_r(err, buf, sizeof buf);
    return std::string(s) + " [" + std::to_string(err) + "]";
}

std::string IoResult::describe() const {
    switch (status) {
        case IoStatus::Ok: return "ok";
        case IoStatus::Eof:
            return "connection closed by peer after " + std::to_string(done) + " bytes";
        case IoStatus::Timeout:
            return "timed out with no progress after " + std::to_string(done) + " bytes";
        case IoStatus::Error: return errno_string(err);
    }
    return "?";
}

IoResult io_error(int e, size_t done) {
    IoResult r;
    r.done = done;
    if (e == EAGAIN || e == EWOULDBLOCK) {
        r.status = IoStatus::Timeout;
    } else {
        r.status = IoStatus::Error;
        r.err = e;
    }
    return r;
}

IoResult io_eof(size_t done) {
    IoResult r;
    r.status = IoStatus::Eof;
    r.done = done;
    return r;
}

IoResult send_all(int fd, const void *data, size_t len) {
    const char *p = static_cast<const char *>(data);
    size_t done = 0;
    while (done < len) {
        ssize_t n = ::send(fd, p + done, len - done, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return io_error(errno, done);
        }
        done += static_cast<size_t>(n);
    }
    IoResult r;
    r.done = done;
    return r;
}

static void advance_iov(struct iovec *&iov, int &cnt, size_t n) {
    while (cnt > 0 && n >= iov->iov_len) {
        n -= iov->iov_len;
        ++iov;
        --cnt;
    }
    if (cnt > 0 && n > 0) {
        iov->iov_base = static_cast<char *>(iov->iov_base) + n;
        iov->iov_len -= n;
    }
}

IoResult sendv_all(int fd, struct iovec *iov, int iovcnt) {
    size_t done = 0;
    while (iovcnt > 0 && iov->iov_len == 0) {
        ++iov;
        --iovcnt;
    }
    while (iovcnt > 0) {
        struct msghdr msg;
        std::memset(&msg, 0, sizeof msg);
        msg.msg_iov = iov;
        msg.msg_iovlen = static_cast<size_t>(iovcnt);
        ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return io_error(errno, done);
        }
        done += static_cast<size_t>(n);
        advance_iov(iov, iovcnt, static_cast<size_t>(n));
    }
    IoResult r;
    r.done = done;
    return r;
}

IoResult recvv_all(int fd, struct iovec *iov, int iovcnt) {
    size_t done = 0;
    while (iovcnt > 0 && iov->iov_len == 0) {
        ++iov;
        --iovcnt;
    }
    while (iovcnt > 0) {
        ssize_t n = ::readv(fd, iov, iovcnt);
        if (n < 0) {
            if (errno == EINTR) continue;
            return io_error(errno, done);
        }
        if (n == 0) return io_eof(done);
        done += static_cast<size_t>(n);
        advance_iov(iov, iovcnt, static_cast<size_t>(n));
    }
    IoResult r;
    r.done = done;
    return r;
}

IoResult recv_all(int fd, void *data, size_t len) {
    struct iovec one {data, len};
    return recvv_all(fd, &one, 1);
}

void set_io_timeouts(int fd, int recv_timeout_ms, int send_timeout_ms) {
    struct timeval tv;
    tv.tv_sec = recv_timeout_ms / 1000;
    tv.tv_usec = (recv_timeout_ms % 1000) * 1000;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    tv.tv_sec = send_timeout_ms / 1000;
    tv.tv_usec = (send_timeout_ms % 1000) * 1000;
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    // SO_SNDTIMEO bounds one send call's wait for buffer space, not how long
    // the peer has acknowledged nothing: when a link dies, a call begun
    // earlier still returns partial progress, and the kernel frees some
    // buffer space when the carrier drops, so a sender noticed a dead link
    // only after two or three timeouts. TCP_USER_TIMEOUT has the kernel
    // abort the connection once sent data stays unacknowledged that long
    // (ETIMEDOUT). Not a TCP socket: the call fails harmlessly.
    unsigned int unacked_ms = static_cast<unsigned int>(send_timeout_ms);
    ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &unacked_ms, sizeof unacked_ms);
}

void set_nodelay(int fd) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool set_nonblocking(int fd, bool on) {
    int flags = ::fcntl(fd, F_GETFL, 0);
    if (flags < 0) return false;
    flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
    return ::fcntl(fd, F_SETFL, flags) == 0;
}

static bool connect_one(const struct addrinfo *ai, int timeout_ms, Fd &out, std::string &err) {
    Fd s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s.valid()) {
        err = "socket(): " + errno_string(errno);
        return false;
    }
    if (!set_nonblocking(s.get(), true)) {
        err = "fcntl(O_NONBLOCK): " + errno_string(errno);
        return false;
    }
    int rc = ::connect(s.get(), ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno != EINPROGRESS) {
        err = errno_string(errno);
        return false;
    }
    if (rc != 0) {
        struct pollfd pfd;
        pfd.fd = s.get();
        pfd.events = POLLOUT;
        pfd.revents = 0;
        int pr;
        do {
            pr = ::poll(&pfd, 1, timeout_ms);
        } while (pr < 0 && errno == EINTR);
        if (pr == 0) {
            err = "connect timed out after " + std::to_string(timeout_ms) + " ms";
            return false;
        }
        if (pr < 0) {
            err = "poll(): " + errno_string(errno);
            return false;
        }
        int soerr = 0;
        socklen_t len = sizeof soerr;
        ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &soerr, &len);
        if (soerr != 0) {
            err = errno_string(soerr);
            return false;
        }
    }
    set_nonblocking(s.get(), false);
    set_nodelay(s.get());
    out = std::move(s);
    return true;
}

void AddrInfoFree::operator()(struct addrinfo *a) const {
    if (a) ::freeaddrinfo(a);
}

namespace {

// What a resolver thread hands back; shared so that a caller that stopped
// waiting leaves it to the thread.
struct PendingLookup {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    int gai = 0;
    AddrList result;
};

}  // namespace

AddrList resolve_tcp(const std::string &host, uint16_t port, int timeout_ms, std::string &err) {
    struct addrinfo hints;
    std::memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    const std::string port_s = std::to_string(port);
    struct addrinfo *res = nullptr;
    if (::getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res) == 0 && res) return AddrList(res);
    hints.ai_flags = AI_NUMERICSERV;
    auto lookup = std::make_shared<PendingLookup>();
    try {
        std::thread([lookup, host, port_s, hints] {
            struct addrinfo *r = nullptr;
            int gai = ::getaddrinfo(host.c_str(), port_s.c_str(), &hints, &r);
            AddrList found(r);
            try {
                std::lock_guard<std::mutex> lk(lookup->mu);
                lookup->gai = gai;
                lookup->result = std::move(found);
                lookup->done = true;
                lookup->cv.notify_all();
            } catch (...) {
                // A mutex that cannot be locked: the caller times out.
            }
        }).detach();
    } catch (const std::exception &e) {
        err = "cannot resolve '" + host + "': no thread for the lookup (" + e.what() + ")";
        return AddrList();
    }
    std::unique_lock<std::mutex> lk(lookup->mu);
    if (!lookup->cv.wait_for(lk, std::chrono::milliseconds(std::max(timeout_ms, 1)), [&] { return lookup->done; })) {
        err = "cannot resolve '" + host + "': no answer from the resolver within " + std::to_string(timeout_ms) + " ms";
        return AddrList();
    }
    if (lookup->gai != 0 || !lookup->result) {
        err = "cannot resolve '" + host + "': " + gai_strerror(lookup->gai);
        return AddrList();
    }
    return std::move(lookup->result);
}

Fd connect_tcp(const std::string &host, uint16_t port, int timeout_ms, int &err_code,
               std::string &err) {
    AddrList res = resolve_tcp(host, port, timeout_ms, err);
    if (!res) {
        err_code = kErrDns;
        return Fd();
    }
    Fd out;
    std::string last;
    for (struct addrinfo *ai = res.get(); ai; ai = ai->ai_next) {
        if (connect_one(ai, timeout_ms, out, last)) break;
    }
    if (!out.valid()) {
        err_code = kErrSocket;
        err = "connect to " + join_host_port(host, port) + " failed: " + last;
    }
    return out;
}

static Fd bind_listen(const std::string &bind_host, uint16_t port, int backlog, std::string &err) {
    struct sockaddr_storage ss;
    std::memset(&ss, 0, sizeof ss);
    socklen_t sl = 0;
    int family = AF_INET6;
    bool dual = false;
    if (bind_host.empty() || bind_host == "::" || bind_host == "[::]") {
        auto *a6 = reinterpret_cast<sockaddr_in6 *>(&ss);
        a6->sin6_family = AF_INET6;
        a6->sin6_addr = in6addr_any;
        a6->sin6_port = htons(port);
        sl = sizeof *a6;
        dual = true;
    } else {
        std::string h = bind_host;
        if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
        auto *a4 = reinterpret_cast<sockaddr_in *>(&ss);
        auto *a6 = reinterpret_cast<sockaddr_in6 *>(&ss);
        if (inet_pton(AF_INET, h.c_str(), &a4->sin_addr) == 1) {
            a4->sin_family = AF_INET;
            a4->sin_port = htons(port);
            sl = sizeof *a4;
            family = AF_INET;
        } else if (inet_pton(AF_INET6, h.c_str(), &a6->sin6_addr) == 1) {
            a6->sin6_family = AF_INET6;
            a6->sin6_port = htons(port);
            sl = sizeof *a6;
        } else {
            err = "bind address '" + bind_host + "' is not a numeric IPv4/IPv6 address";
            return Fd();
        }
    }
    Fd s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid() && dual) {
        // No IPv6 on this host: fall back to the IPv4 wildcard.
        auto *a4 = reinterpret_cast<sockaddr_in *>(&ss);
        std::memset(&ss, 0, sizeof ss);
        a4->sin_family = AF_INET;
        a4->sin_addr.s_addr = htonl(INADDR_ANY);
        a4->sin_port = htons(port);
        sl = sizeof *a4;
        family = AF_INET;
        dual = false;
        s.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    }
    if (!s.valid()) {
        err = "socket(): " + errno_string(errno);
        return Fd();
    }
    int one = 1;
    ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (dual) {
        int zero = 0;
        ::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    }
    if (::bind(s.get(), reinterpret_cast<sockaddr *>(&ss), sl) != 0) {
        err = "bind to port " + std::to_string(port) + ": " + errno_string(errno);
        return Fd();
    }
    if (::listen(s.get(), backlog) != 0) {
        err = "listen(): " + errno_string(errno);
        return Fd();
    }
    return s;
}

Fd listen_tcp(const std::string &bind_host, uint16_t port, int backlog, std::string &err) {
    if (port == 0) {
        err = "port 0 is not a valid listening port here";
        return Fd();
    }
    return bind_listen(bind_host, port, backlog, err);
}

Fd listen_tcp_random(const std::string &bind_host, uint16_t min_port, uint16_t max_port,
                     int attempts, int backlog, uint16_t &port_out, std::string &err) {
    if (min_port == 0 || min_port > max_port) {
        err = "invalid port range " + std::to_string(min_port) + ".." + std::to_string(max_port);
        return Fd();
    }
    std::random_device rd;
    std::mt19937 gen(rd());
    std::uniform_int_distribution<unsigned> dist(min_port, max_port);
    std::string last;
    for (int i = 0; i < attempts; ++i) {
        uint16_t p = static_cast<uint16_t>(dist(gen));
        Fd s = bind_listen(bind_host, p, backlog, last);
        if (s.valid()) {
            port_out = p;
            return s;
        }
    }
    err = "no free port in " + std::to_string(min_port) + ".." + std::to_string(max_port) +
          " after " + std::to_string(attempts) + " attempts (last: " + last + ")";
    return Fd();
}

int wait_readable(int fd, int wake_fd, int timeout_ms) {
    struct pollfd pfd[2];
    pfd[0].fd = fd;
    pfd[0].events = POLLIN;
    pfd[0].revents = 0;
    pfd[1].fd = wake_fd;
    pfd[1].events = POLLIN;
    pfd[1].revents = 0;
    int n = wake_fd >= 0 ? 2 : 1;
    for (;;) {
        int r = ::poll(pfd, static_cast<nfds_t>(n), timeout_ms);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return 0;
        if (n == 2 && pfd[1].revents) return -1;
        return 1;
    }
}

WakePipe::WakePipe() {
    if (::pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
        fds_[0] = fds_[1] = -1;
        throw Error(kErrSocket, "pipe2(): " + errno_string(errno));
    }
}

WakePipe::~WakePipe() {
    if (fds_[0] >= 0) ::close(fds_[0]);
    if (fds_[1] >= 0) ::close(fds_[1]);
}

void WakePipe::wake() {
    char c = 1;
    ssize_t r = ::write(fds_[1], &c, 1);
    (void)r;
}

}  // namespace mcrs
