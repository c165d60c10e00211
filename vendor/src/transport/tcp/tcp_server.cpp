#include "transport/tcp/tcp_server.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "gpu/gpu.h"
#include "transport/tcp/tcp_wire.h"

namespace mcrs {

namespace {

constexpr uint64_t kMaxDrainBytes = 16u << 20;
constexpr size_t kInBuf = 65536;              // request headers read ahead
// WRITE payloads up to this size come through the read-ahead buffer (one
// recv brings many small requests, at the price of one memcpy each);
// larger ones go straight from the socket into memory.
constexpr size_t kSmallPayload = 16384;
constexpr size_t kMaxOutIov = 512;            // gathered answer pieces
constexpr size_t kMaxOutBytes = size_t(4) << 20;  // flushed at this size

std::string describe_request(const TcpHeader &h) {
    std::ostringstream s;
    const char *op = tcp_is_write(h.opcode) ? "WRITE" : "READ";
    s << op << " of " << h.size << " bytes at 0x" << std::hex << h.addr;
    return s.str();
}

// Requests served in one worker pass before a connection that still has
// input goes to the back of the queue (others may be waiting for a worker).
constexpr unsigned kPassBudget = 1024;
// While other workers are idle, a worker waits this long for a connection's
// next request before handing it back to the loop: a peer that sends runs
// of requests then costs no thread hand-off per run. A connection that gets
// ready meanwhile goes to an idle worker, so lingering delays nobody.
constexpr int kLingerMs = 10;

// epoll tags of the listener and the wake pipe (sessions use their address).
char kListenerTag, kWakeTag;

enum class Got { Ok, Eof, WouldBlock, Woken, Error };

}  // namespace

// One connection's state: read-ahead of request headers and the answers
// gathered but not sent yet (with the pins of the memory they point to).
class TcpServer::Conn {
public:
    Conn(int fd, int wake_fd, const std::atomic<size_t> &queued, const std::atomic<size_t> &idle)
        : fd_(fd), wake_fd_(wake_fd), queued_(queued), idle_(idle) {
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
    // The loop saw the socket readable.
    void mark_readable() { drained_ = false; }

    // Makes at least `need` bytes available in the read-ahead buffer
    // (need <= kInBuf). Sends the gathered answers before it would wait:
    // when the last read found the socket drained, answer first, then
    // linger briefly (only while another worker is idle),
    // else report WouldBlock so that the loop waits instead. A pipelining
    // peer gets many answers per sendmsg.
    Got fill(size_t need) {
        while (end_ - beg_ < need) {
            if (kInBuf - beg_ < need || end_ == kInBuf) {
                std::memmove(in_, in_ + beg_, end_ - beg_);
                end_ -= beg_;
                beg_ = 0;
            }
            if (drained_) {
                if (!flush()) return Got::Error;
                if (idle_.load(std::memory_order_relaxed) <= queued_.load(std::memory_order_relaxed))
                    return Got::WouldBlock;
                int r = wait_readable(fd_, wake_fd_, kLingerMs);
                if (r == 0) return Got::WouldBlock;
                if (r < 0) return Got::Woken;
                drained_ = false;
            }
            // After a WRITE, read just the header: when the next request is
            // a WRITE too (a peer sending one at a time), its payload then
            // goes straight into memory instead of through this buffer.
            size_t space = after_write_ && !small_write_ ? need - (end_ - beg_) : kInBuf - end_;
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
        if (n <= kSmallPayload) return read_small_payload(mem, n);
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

    // A small payload: read ahead as much as the socket has (the requests
    // that follow, with their payloads, usually), then copy it out.
    IoResult read_small_payload(char *mem, size_t n) {
        bool tried_nonblocking = false;
        while (buffered() < n) {
            if (kInBuf - beg_ < n || end_ == kInBuf) {
                std::memmove(in_, in_ + beg_, end_ - beg_);
                end_ -= beg_;
                beg_ = 0;
            }
            const size_t space = kInBuf - end_;
            ssize_t got = ::recv(fd_, in_ + end_, space, tried_nonblocking ? 0 : MSG_DONTWAIT);
            if (got < 0) {
                if (errno == EINTR) continue;
                if ((errno == EAGAIN || errno == EWOULDBLOCK) && !tried_nonblocking) {
                    // Would block: answer what is gathered, then wait.
                    tried_nonblocking = true;
                    if (!flush()) return failed(err_ ? err_ : EPIPE, 0);
                    continue;
                }
                IoResult r;
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
                return r;
            }
            end_ += static_cast<size_t>(got);
            drained_ = static_cast<size_t>(got) < space;
            tried_nonblocking = false;
        }
        std::memcpy(mem, head(), n);
        consume(n);
        IoResult r;
        r.done = n;
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
        ++ndata_;
        out_bytes_ += n;
        if (pin) pins_.push_back(std::move(pin));
        if (out_bytes_ >= kMaxOutBytes) return flush();
        return true;
    }
    // True when gathered READ data not sent yet lies in [p, p+n): a WRITE
    // there must wait for it, or the READ would answer with newer bytes.
    // Runs of WRITEs gather only status frames: nothing to scan then.
    bool pending_overlaps(const char *p, size_t n) const {
        if (ndata_ == 0) return false;
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
        ndata_ = 0;
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

    int fd_, wake_fd_;
    const std::atomic<size_t> &queued_, &idle_;
    int err_ = 0;
    bool drained_ = true;  // the last read left nothing in the socket

public:
    bool after_write_ = false;  // the last request carried a payload
    bool small_write_ = false;  // ... of at most kSmallPayload bytes

private:
    unsigned char in_[kInBuf];
    size_t beg_ = 0, end_ = 0;
    struct iovec out_[kMaxOutIov];
    uint64_t st_[kMaxOutIov];
    size_t nout_ = 0, out_bytes_ = 0;
    size_t ndata_ = 0;  // of the nout_ pieces, READ data (not status frames)
    std::vector<RegionPin> pins_;
};

TcpServer::TcpServer(Fd listener, const MemoryRegistry &registry, TcpServerOptions opt)
    : listener_(std::move(listener)), registry_(registry), opt_(std::move(opt)) {
    set_nonblocking(listener_.get(), true);
    per_source_cap_ = opt_.max_connections_per_source;
    if (per_source_cap_ == 0) per_source_cap_ = std::max<uint32_t>(8, opt_.max_connections / 8);
    if (opt_.workers == 0) {
        unsigned hw = std::thread::hardware_concurrency();
        opt_.workers = std::min(64u, std::max(8u, 2 * hw));
    }
    ready_.assign(opt_.max_connections, nullptr);
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_.valid()) throw Error(kErrSocket, "epoll_create1(): " + errno_string(errno));
    struct epoll_event ev;
    std::memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.ptr = &kListenerTag;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &ev) != 0)
        throw Error(kErrSocket, "epoll_ctl(listener): " + errno_string(errno));
    ev.data.ptr = &kWakeTag;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.read_fd(), &ev) != 0)
        throw Error(kErrSocket, "epoll_ctl(wake): " + errno_string(errno));
}

TcpServer::~TcpServer() { stop(); }

void TcpServer::start() {
    next_scan_ = Clock::now();
    loop_thread_ = std::thread([this] { loop(); });
    for (uint32_t i = 0; i < opt_.workers; ++i) workers_.emplace_back([this] { worker(); });
}

void TcpServer::stop() {
    if (stopping_.exchange(true)) return;
    wake_.wake();
    if (loop_thread_.joinable()) loop_thread_.join();
    {
        // Unblock workers waiting in recv/send on a connection; after the
        // joins no server thread touches registered memory.
        std::lock_guard<std::mutex> g(mu_);
        for (auto &kv : sessions_) ::shutdown(kv.first->fd.get(), SHUT_RDWR);
    }
    ready_cv_.notify_all();
    for (auto &t : workers_)
        if (t.joinable()) t.join();
    std::lock_guard<std::mutex> g(mu_);
    ready_len_ = 0;
    sessions_.clear();
    per_source_.clear();
}

size_t TcpServer::connection_count() const {
    std::lock_guard<std::mutex> g(mu_);
    return sessions_.size();
}

void TcpServer::erase_locked(Session *s) {
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, s->fd.get(), nullptr);
    // FIN now (the descriptor closes with the session).
    ::shutdown(s->fd.get(), SHUT_RDWR);
    auto it = per_source_.find(s->source);
    if (it != per_source_.end() && --it->second == 0) per_source_.erase(it);
    sessions_.erase(s);
}

void TcpServer::push_ready_locked(Session *s) {
    ready_[(ready_head_ + ready_len_) % ready_.size()] = s;
    ++ready_len_;
    ready_count_.store(ready_len_, std::memory_order_relaxed);
    ready_cv_.notify_one();
}

void TcpServer::loop() {
    struct epoll_event evs[64];
    while (!stopping_.load()) {
        auto now = Clock::now();
        int timeout = static_cast<int>(
            std::chrono::duration_cast<std::chrono::milliseconds>(next_scan_ - now).count());
        timeout = std::max(0, std::min(timeout, 100));
        int n = ::epoll_wait(epoll_.get(), evs, 64, timeout);
        if (n < 0) {
            if (errno == EINTR) continue;
            MC_LOG(Error, "TCP server: epoll_wait(): " << errno_string(errno));
            break;
        }
        if (stopping_.load()) break;
        bool accept = false;
        {
            std::lock_guard<std::mutex> g(mu_);
            for (int i = 0; i < n; ++i) {
                void *p = evs[i].data.ptr;
                if (p == &kListenerTag) {
                    accept = true;
                } else if (p != &kWakeTag) {
                    Session *s = static_cast<Session *>(p);
                    s->in_loop = false;
                    s->conn->mark_readable();
                    push_ready_locked(s);
                }
            }
        }
        if (accept) accept_all();
        now = Clock::now();
        if (now >= next_scan_) expire_idle(now);
    }
}

void TcpServer::expire_idle(Clock::time_point now) {
    std::lock_guard<std::mutex> g(mu_);
    Clock::time_point next = now + std::chrono::milliseconds(100);
    std::vector<Session *> expired;
    for (auto &kv : sessions_) {
        Session *s = kv.first;
        if (!s->in_loop) continue;
        if (s->deadline <= now) expired.push_back(s);
        else if (s->deadline < next) next = s->deadline;
    }
    for (Session *s : expired) {
        idle_closed_.fetch_add(1, std::memory_order_relaxed);
        MC_LOG(Debug, "TCP server: closing an idle connection from " << source_text(s->source)
                          << (s->partial        ? " (request header stalled)"
                              : s->served_any ? " (pooled)"
                                              : " (no request)"));
        erase_locked(s);
    }
    next_scan_ = next;
}

void TcpServer::accept_all() {
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int fd = ::accept4(listener_.get(), reinterpret_cast<sockaddr *>(&ss), &len, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                MC_LOG(Warn, "TCP server: accept(): " << errno_string(errno));
            return;
        }
        Fd guard(fd);
        std::string src = source_key(ss);
        const char *why = nullptr;
        std::lock_guard<std::mutex> g(mu_);
        auto it = per_source_.find(src);
        uint32_t from_src = it == per_source_.end() ? 0 : it->second;
        if (!opt_.allowed_peers.allows(src)) why = "not in the allowed peer networks";
        else if (sessions_.size() >= opt_.max_connections) why = "the connection limit is reached";
        else if (from_src >= per_source_cap_) why = "its address is at its connection limit";
        if (why) {
            refused_.fetch_add(1, std::memory_order_relaxed);
            uint64_t skipped = 0;
            if (refuse_log_.should_log(skipped))
                MC_LOG(Warn, "TCP data server: refused a connection from " << source_text(src)
                                 << ": " << why << " (limits: " << opt_.max_connections
                                 << " in all, " << per_source_cap_ << " per address; " << skipped
                                 << " more refusals not logged)");
            continue;
        }
        set_nonblocking(fd, false);
        set_nodelay(fd);
        // Inside a request the progress timeout bounds each blocking call.
        set_io_timeouts(fd, static_cast<int>(opt_.progress_timeout_ms),
                        static_cast<int>(opt_.progress_timeout_ms));
        auto s = std::make_unique<Session>();
        s->fd = std::move(guard);
        s->source = src;
        s->conn = std::make_unique<Conn>(fd, wake_.read_fd(), ready_count_, idle_workers_);
        s->deadline = Clock::now() + std::chrono::milliseconds(opt_.idle_timeout_ms);
        if (s->deadline < next_scan_) next_scan_ = s->deadline;
        struct epoll_event ev;
        std::memset(&ev, 0, sizeof ev);
        ev.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
        ev.data.ptr = s.get();
        if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
            MC_LOG(Warn, "TCP server: epoll_ctl(add): " << errno_string(errno));
            continue;
        }
        ++per_source_[src];
        Session *raw = s.get();
        sessions_.emplace(raw, std::move(s));
    }
}

void TcpServer::worker() {
    for (;;) {
        Session *s = nullptr;
        {
            std::unique_lock<std::mutex> lk(mu_);
            idle_workers_.fetch_add(1, std::memory_order_relaxed);
            ready_cv_.wait(lk, [this] { return stopping_.load() || ready_len_ != 0; });
            idle_workers_.fetch_sub(1, std::memory_order_relaxed);
            if (stopping_.load()) return;
            s = ready_[ready_head_];
            ready_head_ = (ready_head_ + 1) % ready_.size();
            --ready_len_;
            ready_count_.store(ready_len_, std::memory_order_relaxed);
        }
        finish(s, serve(*s));
    }
}

void TcpServer::finish(Session *s, Pass p) {
    std::lock_guard<std::mutex> g(mu_);
    if (p == Pass::Close || stopping_.load()) {
        erase_locked(s);
        return;
    }
    if (p == Pass::Again) {
        // More input is waiting: behind whoever else is queued.
        push_ready_locked(s);
        return;
    }
    auto now = Clock::now();
    const bool partial = s->conn->buffered() != 0;
    if (!s->served_any) {
        // Keeps the deadline set at accept: the first header is due by then.
    } else if (partial) {
        // The rest of a header is due within the progress timeout of its
        // first byte, however slowly it trickles in.
        if (!s->partial) s->deadline = now + std::chrono::milliseconds(opt_.progress_timeout_ms);
    } else {
        s->deadline = now + std::chrono::milliseconds(opt_.pooled_idle_timeout_ms);
    }
    s->partial = partial;
    s->in_loop = true;
    struct epoll_event ev;
    std::memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
    ev.data.ptr = s;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, s->fd.get(), &ev) != 0) {
        MC_LOG(Warn, "TCP server: epoll_ctl(mod): " << errno_string(errno));
        erase_locked(s);
    }
}

// Serves the requests that have arrived; Idle when the input is drained.
TcpServer::Pass TcpServer::serve(Session &s) {
    const int fd = s.fd.get();
    Conn &c = *s.conn;
    auto drop = [&](const TcpHeader &h, const std::string &why) {
        MC_LOG(Info, "TCP server: " << describe_request(h) << " failed: " << why);
    };
    unsigned served = 0;
    while (!stopping_.load()) {
        if (served >= kPassBudget && ready_count_.load(std::memory_order_relaxed) != 0) {
            if (!c.flush()) break;
            return Pass::Again;
        }
        Got g = c.fill(kTcpHeaderLen);
        if (g == Got::WouldBlock) return Pass::Idle;
        if (g != Got::Ok) {
            if (g == Got::Error)
                MC_LOG(Info, "TCP server: dropping a connection while reading a header: "
                                 << errno_string(c.last_errno()));
            else if (g == Got::Eof && c.buffered() != 0)
                MC_LOG(Info, "TCP server: dropping a connection: it closed inside a header");
            // A FIN ends the requests, not the answers to those before it.
            if (g == Got::Eof) c.flush();
            break;
        }
        TcpHeader h = decode_tcp_header(c.head());
        s.served_any = true;
        s.partial = false;
        ++served;

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
            c.small_write_ = size <= kSmallPayload;
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
    return Pass::Close;
}

}  // namespace mcrs
