// Thin RAII and blocking-I/O helpers over BSD sockets. Blocking calls are
// bounded by SO_RCVTIMEO/SO_SNDTIMEO (set by the caller), so a silent peer
// turns into a Timeout result instead of a hang. SIGPIPE is never raised.
#pragma once

#include <netdb.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace mcrs {

class Fd {
public:
    Fd() = default;
    explicit Fd(int fd) : fd_(fd) {}
    ~Fd() { reset(); }
    Fd(const Fd &) = delete;
    Fd &operator=(const Fd &) = delete;
    Fd(Fd &&o) noexcept : fd_(o.release()) {}
    Fd &operator=(Fd &&o) noexcept {
        if (this != &o) reset(o.release());
        return *this;
    }
    int get() const { return fd_; }
    bool valid() const { return fd_ >= 0; }
    int release() {
        int f = fd_;
        fd_ = -1;
        return f;
    }
    void reset(int fd = -1);

private:
    int fd_ = -1;
};

enum class IoStatus { Ok, Eof, Timeout, Error };

struct IoResult {
    IoStatus status = IoStatus::Ok;
    int err = 0;      // errno for Error
    size_t done = 0;  // bytes moved before the result
    bool ok() const { return status == IoStatus::Ok; }
    std::string describe() const;
};

// The result of a failed read or write: EAGAIN/EWOULDBLOCK (a socket
// timeout) is Timeout, anything else Error with the errno.
IoResult io_error(int e, size_t done);
// The peer closed the connection after `done` bytes.
IoResult io_eof(size_t done);

IoResult send_all(int fd, const void *data, size_t len);
// Sends every byte of the iovec array; `iov` is modified in place.
IoResult sendv_all(int fd, struct iovec *iov, int iovcnt);
IoResult recv_all(int fd, void *data, size_t len);
// Reads into the iovec array until it is full; `iov` is modified in place.
IoResult recvv_all(int fd, struct iovec *iov, int iovcnt);

void set_io_timeouts(int fd, int recv_timeout_ms, int send_timeout_ms);
void set_nodelay(int fd);
bool set_nonblocking(int fd, bool on);

struct AddrInfoFree {
    void operator()(struct addrinfo *a) const;
};
using AddrList = std::unique_ptr<struct addrinfo, AddrInfoFree>;

// Resolves `host` for a TCP connection to `port` within `timeout_ms`.
// Numeric addresses never leave the process; a name is looked up on a
// helper thread (getaddrinfo has no timeout of its own), and when the
// resolver does not answer in time the caller gets an error while the
// thread finishes on its own. Null with `err` set on failure.
AddrList resolve_tcp(const std::string &host, uint16_t port, int timeout_ms, std::string &err);

// Resolves `host` and connects with a bounded non-blocking connect, then
// returns a blocking socket with TCP_NODELAY. On failure returns an invalid
// Fd, sets `err_code` to kErrDns or kErrSocket and `err` to a message.
Fd connect_tcp(const std::string &host, uint16_t port, int timeout_ms, int &err_code,
               std::string &err);

// Binds and listens. An empty `bind_host` means the wildcard address (IPv6
// dual stack when available, else IPv4). `port` 0 is not allowed here.
Fd listen_tcp(const std::string &bind_host, uint16_t port, int backlog, std::string &err);
// Binds a random port in [min_port, max_port] (up to `attempts` tries).
Fd listen_tcp_random(const std::string &bind_host, uint16_t min_port, uint16_t max_port,
                     int attempts, int backlog, uint16_t &port_out, std::string &err);

// Waits until `fd` is readable or `wake_fd` becomes readable or the timeout
// (ms, -1 = forever) expires. Returns 1 readable, 0 timeout, -1 woken/error.
int wait_readable(int fd, int wake_fd, int timeout_ms);

std::string errno_string(int err);

// A self-pipe used to wake threads blocked in poll() at shutdown.
class WakePipe {
public:
    WakePipe();
    ~WakePipe();
    WakePipe(const WakePipe &) = delete;
    WakePipe &operator=(const WakePipe &) = delete;
    int read_fd() const { return fds_[0]; }
    void wake();

private:
    int fds_[2] = {-1, -1};
};

}  // namespace mcrs
