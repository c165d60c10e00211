#include "transport/tcp/tcp_server.h"

#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "gpu/gpu.h"
#include "transport/tcp/tcp_wire.h"

namespace mcrs {

TcpServer::TcpServer(Fd listener, const MemoryRegistry &registry, TcpServerOptions opt)
    : listener_(std::move(listener)), registry_(registry), opt_(opt) {
    set_nonblocking(listener_.get(), true);
}

TcpServer::~TcpServer() { stop(); }

void TcpServer::start() { acceptor_ = std::thread([this] { accept_loop(); }); }

void TcpServer::stop() {
    if (stopping_.exchange(true)) return;
    wake_.wake();
    if (acceptor_.joinable()) acceptor_.join();
    std::list<std::unique_ptr<Session>> sessions;
    {
        std::lock_guard<std::mutex> g(mu_);
        sessions.swap(sessions_);
    }
    // Unblock sessions waiting in recv/send, then join them: after stop()
    // no server thread touches registered memory.
    for (auto &s : sessions) ::shutdown(s->fd.get(), SHUT_RDWR);
    for (auto &s : sessions)
        if (s->thread.joinable()) s->thread.join();
}

void TcpServer::reap_finished() {
    for (auto it = sessions_.begin(); it != sessions_.end();) {
        if ((*it)->done.load()) {
            if ((*it)->thread.joinable()) (*it)->thread.join();
            it = sessions_.erase(it);
        } else {
            ++it;
        }
    }
}

void TcpServer::accept_loop() {
    while (!stopping_.load()) {
        int r = wait_readable(listener_.get(), wake_.read_fd(), -1);
        if (r < 0 || stopping_.load()) break;
        for (;;) {
            int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EINTR) continue;
                break;
            }
            std::lock_guard<std::mutex> g(mu_);
            reap_finished();
            if (sessions_.size() >= opt_.max_connections) {
                MC_LOG(Warn, "TCP data server at its limit of " << opt_.max_connections
                                                                << " connections; refusing one");
                Fd drop(fd);
                continue;
            }
            set_nonblocking(fd, false);
            set_nodelay(fd);
            set_io_timeouts(fd, static_cast<int>(opt_.progress_timeout_ms),
                            static_cast<int>(opt_.progress_timeout_ms));
            auto s = std::make_unique<Session>();
            s->fd.reset(fd);
            Session *raw = s.get();
            sessions_.push_back(std::move(s));
            raw->thread = std::thread([this, raw] { serve(raw); });
        }
    }
}

namespace {

constexpr uint64_t kMaxDrainBytes = 16u << 20;
constexpr size_t kInBuf = 16384;              // request headers read ahead
constexpr size_t kMaxOutIov = 512;            // gathered answer pieces
constexpr size_t kMaxOutBytes = size_t(4) << 20;  // flushed at this size

std::string describe_request(const TcpHeader &h) {
    std::ostringstream s;
    const char *op = tcp_is_write(h.opcode) ? "WRITE" : "READ";
    s << op << " of " << h.size << " bytes at 0x" << std::hex << h.addr;
    return s.str();
}

enum class Got { Ok, Eof, Timeout, Woken, Error };

}  // namespace

// One connection's state: read-ahead of request headers and the answers
// gathered but not sent yet (with the pins of the memory they point to).
class TcpServer::Conn {
public:
    Conn(int fd, int wake_fd, int timeout_ms) : fd_(fd), wake_fd_(wake_fd), timeout_ms_(timeout_ms) {
        pins_.reserve(kMaxOutIov);
    }

    int fd() const { return fd_; }
    size_t buffered() const { return end_ - beg_; }
    const unsigned char *head() const { return in_ + beg_; }
    void consume(size_t n) {
        beg_ += n;
        if (beg_ == end_) beg_ = end_ = 0;
    }
    int last_errno() const { return err_; }

    // Makes at least `need` bytes available in the read-ahead buffer
    // (need <= kInBuf). Sends the gathered answers before it waits: when the
    // last read found the socket drained, answer first and then poll, so a
    // peer that sends one request at a time costs poll + recv + sendmsg per
    // request, and a pipelining one gets many answers per sendmsg.
    Got fill(size_t need) {
        while (end_ - beg_ < need) {
            if (kInBuf - beg_ < need || end_ == kInBuf) {
                std::memmove(in_, in_ + beg_, end_ - beg_);
                end_ -= beg_;
                beg_ = 0;
            }
            if (drained_) {
                if (!flush()) return Got::Error;
                // Between requests there is no deadline (peers pool their
                // connections); inside one, the progress timeout applies.
                int r = wait_readable(fd_, wake_fd_, end_ == beg_ ? -1 : timeout_ms_);
                if (r == 0) return Got::Timeout;
                if (r < 0) return Got::Woken;
                drained_ = false;
            }
            // After a WRITE, read just the header: when the next request is
            // a WRITE too (a peer sending one at a time), its payload then
            // goes straight into memory instead of through this buffer.
            size_t space = after_write_ ? need - (end_ - beg_) : kInBuf - end_;
            ssize_t n = ::recv(fd_, in_ + end_, space, MSG_DONTWAIT);
            if (n > 0) {
                end_ += static_cast<size_t>(n);
                drained_ = static_cast<size_t>(n) < space;
                continue;
            }
            if (n == 0) return Got::Eof;
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                err_ = errno;
                return Got::Error;
            }
            drained_ = true;
        }
        return Got::Ok;
    }

    // Receives `n` payload bytes into `mem`: what was read ahead first,
    // then straight from the socket, together with the next header when it
    // is already there.
    IoResult read_payload(char *mem, size_t n) {
        size_t done = buffered() < n ? buffered() : n;
        std::memcpy(mem, head(), done);
        consume(done);
        bool tried_nonblocking = false;
        while (done < n) {
            // The read-ahead buffer is empty here: the next header may share
            // this read (never more than a header, so no payload is copied
            // twice).
            struct iovec iov[2] = {{mem + done, n - done}, {in_ + end_, kTcpHeaderLen}};
            struct msghdr msg;
            std::memset(&msg, 0, sizeof msg);
            msg.msg_iov = iov;
            msg.msg_iovlen = 2;
            ssize_t got = ::recvmsg(fd_, &msg, tried_nonblocking ? 0 : MSG_DONTWAIT);
            if (got < 0) {
                if (errno == EINTR) continue;
                if ((errno == EAGAIN || errno == EWOULDBLOCK) && !tried_nonblocking) {
                    // Would block: answer what is gathered, then wait.
                    tried_nonblocking = true;
                    if (!flush()) return failed(err_ ? err_ : EPIPE, done);
                    continue;
                }
                IoResult r;
                r.done = done;
                if (errno == EAGAIN || errno == EWOULDBLOCK) {
                    r.status = IoStatus::Timeout;
                } else {
                    r.status = IoStatus::Error;
                    r.err = errno;
                }
                return r;
            }
            if (got == 0) {
                IoResult r;
                r.status = IoStatus::Eof;
                r.done = done;
                return r;
            }
            size_t g = static_cast<size_t>(got);
            size_t to_mem = g < n - done ? g : n - done;
            done += to_mem;
            end_ += g - to_mem;
            // Short of the next header: the socket had no more for now.
            drained_ = g - to_mem < kTcpHeaderLen;
            tried_nonblocking = false;
        }
        IoResult r;
        r.done = done;
        return r;
    }

    bool room(size_t pieces, size_t bytes) const {
        return nout_ + pieces <= kMaxOutIov && out_bytes_ + bytes <= kMaxOutBytes;
    }
    // Queues a status frame (v2) for sending.
    bool add_status(uint32_t code) {
        if (!room(1, 8) && !flush()) return false;
        // Each gathered piece has its own status slot.
        unsigned char *slot = reinterpret_cast<unsigned char *>(&st_[nout_]);
        put_le64(slot, encode_tcp_status(code));
        out_[nout_] = {slot, 8};
        ++nout_;
        out_bytes_ += 8;
        return true;
    }
    // Queues bytes of memory that stays valid while `pin` is held.
    bool add_data(const void *p, size_t n, RegionPin pin) {
        if (!room(1, 0) && !flush()) return false;
        out_[nout_] = {const_cast<void *>(p), n};
        ++nout_;
        out_bytes_ += n;
        if (pin) pins_.push_back(std::move(pin));
        if (out_bytes_ >= kMaxOutBytes) return flush();
        return true;
    }
    // True when gathered READ data not sent yet lies in [p, p+n): a WRITE
    // there must wait for it, or the READ would answer with newer bytes.
    bool pending_overlaps(const char *p, size_t n) const {
        for (size_t i = 0; i < nout_; ++i) {
            const char *b = static_cast<const char *>(out_[i].iov_base);
            if (b < p + n && p < b + out_[i].iov_len && !is_status(b)) return true;
        }
        return false;
    }
    bool flush() {
        if (nout_ == 0) return true;
        IoResult io = sendv_all(fd_, out_, static_cast<int>(nout_));
        nout_ = 0;
        out_bytes_ = 0;
        pins_.clear();
        if (!io.ok()) {
            err_ = io.err;
            MC_LOG(Info, "TCP server: sending answers failed: " << io.describe());
        }
        return io.ok();
    }

private:
    bool is_status(const char *b) const {
        const char *st = reinterpret_cast<const char *>(st_);
        return b >= st && b < st + sizeof st_;
    }
    IoResult failed(int e, size_t done) {
        IoResult r;
        r.status = IoStatus::Error;
        r.err = e;
        r.done = done;
        return r;
    }

    int fd_, wake_fd_, timeout_ms_;
    int err_ = 0;
    bool drained_ = true;  // the last read left nothing in the socket

public:
    bool after_write_ = false;  // the last request carried a payload

private:
    unsigned char in_[kInBuf];
    size_t beg_ = 0, end_ = 0;
    struct iovec out_[kMaxOutIov];
    uint64_t st_[kMaxOutIov];
    size_t nout_ = 0, out_bytes_ = 0;
    std::vector<RegionPin> pins_;
};

void TcpServer::serve(Session *s) {
    const int fd = s->fd.get();
    auto conn = std::make_unique<Conn>(fd, wake_.read_fd(), static_cast<int>(opt_.progress_timeout_ms));
    Conn &c = *conn;
    auto drop = [&](const TcpHeader &h, const std::string &why) {
        MC_LOG(Info, "TCP server: " << describe_request(h) << " failed: " << why);
    };
    while (!stopping_.load()) {
        Got g = c.fill(kTcpHeaderLen);
        if (g != Got::Ok) {
            if (g == Got::Timeout)
                MC_LOG(Info, "TCP server: dropping a connection: a request header stalled");
            else if (g == Got::Error)
                MC_LOG(Info, "TCP server: dropping a connection while reading a header: "
                                 << errno_string(c.last_errno()));
            else if (g == Got::Eof && c.buffered() != 0)
                MC_LOG(Info, "TCP server: dropping a connection: it closed inside a header");
            // A FIN ends the requests, not the answers to those before it.
            if (g == Got::Eof) c.flush();
            break;
        }
        TcpHeader h = decode_tcp_header(c.head());

        c.consume(kTcpHeaderLen);
        const bool v2 = tcp_is_v2(h.opcode);
        const bool write = tcp_is_write(h.opcode);
        RegionPin pin = registry_.pin(h.addr, h.size, /*need_remote=*/true);
        if (!pin) {
            rejected_.fetch_add(1);
            MC_LOG(Warn, "TCP server: rejected " << describe_request(h)
                                                 << ": not inside one registered "
                                                    "remote-accessible buffer");
            // Earlier answers go out first, in order.
            if (!c.flush()) break;
            if (v2) {
                unsigned char st[8];
                put_le64(st, encode_tcp_status(kTcpStatusRejected));
                send_all(fd, st, sizeof st);
            }
            // A rejected WRITE's payload is still on its way. Discard a
            // modest one so our close is a FIN, not a reset that could
            // destroy the reject frame before the peer reads it.
            if (write && h.size <= kMaxDrainBytes) {
                uint64_t left = h.size;
                size_t have = c.buffered() < left ? c.buffered() : static_cast<size_t>(left);
                c.consume(have);
                left -= have;
                char buf[65536];
                while (left > 0) {
                    size_t want = left < sizeof buf ? static_cast<size_t>(left) : sizeof buf;
                    if (!recv_all(fd, buf, want).ok()) break;
                    left -= want;
                }
            }
            break;  // close: the peer's stream position is unknown from here
        }
        served_.fetch_add(1, std::memory_order_relaxed);
        char *mem = reinterpret_cast<char *>(h.addr);
        const size_t size = static_cast<size_t>(h.size);
        const int device = pin.region()->device;
        if (device >= 0) {
            // GPU memory: staged through pinned buffers, chunk by chunk, in
            // order after everything gathered so far.
            if (!c.flush()) break;
            std::string err;
            IoResult io;
            if (!write) {
                unsigned char st[8];
                put_le64(st, encode_tcp_status(kTcpStatusOk));
                if (v2 && !send_all(fd, st, sizeof st).ok()) break;
                io = gpu::send_from_device(fd, mem, size, device, err);
            } else {
                size_t have = c.buffered() < size ? c.buffered() : size;
                try {
                    if (have) gpu::copy(mem, c.head(), have);
                } catch (const Error &e) {
                    err = e.what();
                }
                c.consume(have);
                if (err.empty()) io = gpu::recv_into_device(fd, mem + have, size - have, device, err);
                else io.status = IoStatus::Error;
                pin.release();
                if (io.ok() && v2) {
                    unsigned char st[8];
                    put_le64(st, encode_tcp_status(kTcpStatusOk));
                    io = send_all(fd, st, sizeof st);
                }
            }
            if (!io.ok()) {
                drop(h, "(GPU " + std::to_string(device) + ") " + (err.empty() ? io.describe() : err));
                break;
            }
            continue;
        }
        if (!write) {
            c.after_write_ = false;
            if (v2 && !c.add_status(kTcpStatusOk)) break;
            if (!c.add_data(mem, size, std::move(pin))) break;
        } else {
            c.after_write_ = true;
            if (c.pending_overlaps(mem, size) && !c.flush()) break;
            IoResult io = c.read_payload(mem, size);
            if (!io.ok()) {
                drop(h, io.describe());
                break;
            }
            pin.release();
            if (v2 && !c.add_status(kTcpStatusOk)) break;
        }
    }
    // Send FIN now; the reaper closes the descriptor later.
    ::shutdown(fd, SHUT_RDWR);
    s->done.store(true);
}

}  // namespace mcrs
