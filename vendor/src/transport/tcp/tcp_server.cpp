#include "transport/tcp/tcp_server.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "gpu/gpu.h"
#include "transport/tcp/tcp_server_conn.h"
#include "transport/tcp/tcp_wire.h"

namespace mcrs {

namespace {

constexpr uint64_t kMaxDrainBytes = 16u << 20;

std::string describe_request(const TcpHeader &h) {
    std::ostringstream s;
    const char *op = tcp_is_write(h.opcode) ? "WRITE" : "READ";
    s << op << " of " << h.size << " bytes at 0x" << std::hex << h.addr;
    return s.str();
}

// Requests served in one worker pass before a connection that still has
// input goes to the back of the queue (others may be waiting for a worker).
constexpr unsigned kPassBudget = 1024;

// epoll tags of the listener and the wake pipe (sessions use their address).
char kListenerTag, kWakeTag;

using Got = TcpServer::Conn::Got;

void log_failed(const TcpHeader &h, const std::string &why) {
    MC_LOG(Info, "TCP server: " << describe_request(h) << " failed: " << why);
}

// The connection ended (or failed) before a whole request header came.
void end_without_header(TcpServer::Conn &c, Got g) {
    if (g == Got::Error)
        MC_LOG(Info, "TCP server: dropping a connection while reading a header: "
                         << errno_string(c.last_errno()));
    else if (g == Got::Eof && c.buffered() != 0)
        MC_LOG(Info, "TCP server: dropping a connection: it closed inside a header");
    // A FIN ends the requests, not the answers to those before it.
    if (g == Got::Eof) c.flush();
}

// Reads and drops `left` payload bytes: the read-ahead first, then the socket.
void discard_payload(TcpServer::Conn &c, uint64_t left) {
    size_t have = c.buffered() < left ? c.buffered() : static_cast<size_t>(left);
    c.consume(have);
    left -= have;
    char buf[65536];
    while (left > 0) {
        size_t want = left < sizeof buf ? static_cast<size_t>(left) : sizeof buf;
        if (!recv_all(c.fd(), buf, want).ok()) break;
        left -= want;
    }
}

}  // namespace

TcpServer::TcpServer(Fd listener, const MemoryRegistry &registry, TcpServerOptions opt)
    : listener_(std::move(listener)),
      registry_(registry),
      opt_(std::move(opt)),
      admission_("TCP data server", opt_.allowed_peers, opt_.max_connections, opt_.max_connections_per_source) {
    set_nonblocking(listener_.get(), true);
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
    admission_.clear();
}

size_t TcpServer::connection_count() const {
    std::lock_guard<std::mutex> g(mu_);
    return sessions_.size();
}

void TcpServer::erase_locked(Session *s) {
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, s->fd.get(), nullptr);
    // FIN now (the descriptor closes with the session).
    ::shutdown(s->fd.get(), SHUT_RDWR);
    admission_.released(s->source);
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
        std::lock_guard<std::mutex> g(mu_);
        const char *why = admission_.refusal(src);
        if (!why && sessions_.size() >= opt_.max_connections) why = "the connection limit is reached";
        if (why) {
            admission_.refuse(src, why);
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
        admission_.admitted(src);
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
    Conn &c = *s.conn;
    unsigned served = 0;
    while (!stopping_.load()) {
        if (served >= kPassBudget && ready_count_.load(std::memory_order_relaxed) != 0) {
            if (!c.flush()) break;
            return Pass::Again;
        }
        Got g = c.fill(kTcpHeaderLen);
        if (g == Got::WouldBlock) return Pass::Idle;
        if (g != Got::Ok) {
            end_without_header(c, g);
            break;
        }
        TcpHeader h = decode_tcp_header(c.head());
        s.served_any = true;
        s.partial = false;
        ++served;

        c.consume(kTcpHeaderLen);
        if (!serve_request(c, h)) break;
    }
    c.stage_fence();  // no staged copy may outlive the pins of its target
    return Pass::Close;
}

bool TcpServer::serve_request(Conn &c, const TcpHeader &h) {
    RegionPin pin = registry_.pin(h.addr, h.size, /*need_remote=*/true);
    if (!pin) {
        reject_request(c, h);
        return false;  // close: the peer's stream position is unknown from here
    }
    served_.fetch_add(1, std::memory_order_relaxed);
    if (pin.region()->device >= 0) return serve_gpu_request(c, h, pin);
    return serve_host_request(c, h, pin);
}

void TcpServer::reject_request(Conn &c, const TcpHeader &h) {
    rejected_.fetch_add(1);
    MC_LOG(Warn, "TCP server: rejected " << describe_request(h)
                                         << ": not inside one registered "
                                            "remote-accessible buffer");
    // Earlier answers go out first, in order.
    if (!c.flush()) return;
    if (tcp_is_v2(h.opcode)) {
        unsigned char st[8];
        put_le64(st, encode_tcp_status(kTcpStatusRejected));
        send_all(c.fd(), st, sizeof st);
    }
    // A rejected WRITE's payload is still on its way. Discard a
    // modest one so our close is a FIN, not a reset that could
    // destroy the reject frame before the peer reads it.
    if (tcp_is_write(h.opcode) && h.size <= kMaxDrainBytes) discard_payload(c, h.size);
}

bool TcpServer::serve_gpu_request(Conn &c, const TcpHeader &h, RegionPin &pin) {
    const int fd = c.fd();
    const bool v2 = tcp_is_v2(h.opcode);
    char *mem = reinterpret_cast<char *>(h.addr);
    const size_t size = static_cast<size_t>(h.size);
    const int device = pin.region()->device;
    if (size <= gpu::StageRing::kMaxPiece) {
        // Small requests (KV blocks): staged in batches on this worker's ring.
        thread_local std::map<int, std::unique_ptr<gpu::StageRing>> rings;
        auto &ring = rings[device];
        if (!ring) ring = std::make_unique<gpu::StageRing>();
        if (c.use_stage(*ring, device)) {
            if (tcp_is_write(h.opcode)) return serve_staged_gpu_write(c, h, pin);
            std::string err;
            if ((!v2 || c.add_status(kTcpStatusOk)) && c.stage_read(mem, size, std::move(pin), err)) return true;
            log_failed(h, "(GPU " + std::to_string(device) + ") " + (err.empty() ? "sending failed" : err));
            return false;
        }
    }
    // GPU memory: staged through pinned buffers, chunk by chunk, in
    // order after everything gathered so far.
    if (!c.flush()) return false;
    std::string err;
    IoResult io;
    if (!tcp_is_write(h.opcode)) {
        unsigned char st[8];
        put_le64(st, encode_tcp_status(kTcpStatusOk));
        if (v2 && !send_all(fd, st, sizeof st).ok()) return false;
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
        log_failed(h, "(GPU " + std::to_string(device) + ") " + (err.empty() ? io.describe() : err));
        return false;
    }
    return true;
}

bool TcpServer::serve_staged_gpu_write(Conn &c, const TcpHeader &h, RegionPin &pin) {
    // The payload lands in a staging slot; its copy to the device is queued
    // and its OK frame goes out once the copy has finished (Conn::flush).
    const size_t size = static_cast<size_t>(h.size);
    std::string err;
    char *slot = c.stage_slot(size, err);
    IoResult io;
    if (slot) io = c.read_payload(slot, size);
    if (!slot || !io.ok()) {
        log_failed(h, "(GPU " + std::to_string(pin.region()->device) + ") " + (slot ? io.describe() : err));
        return false;
    }
    c.stage_copy(reinterpret_cast<char *>(h.addr), slot, size, std::move(pin));
    if (!c.stage_error().empty()) {
        log_failed(h, "(GPU) " + c.stage_error());
        return false;
    }
    return !tcp_is_v2(h.opcode) || c.add_status(kTcpStatusOk);
}

bool TcpServer::serve_host_request(Conn &c, const TcpHeader &h, RegionPin &pin) {
    const bool v2 = tcp_is_v2(h.opcode);
    char *mem = reinterpret_cast<char *>(h.addr);
    const size_t size = static_cast<size_t>(h.size);
    if (!tcp_is_write(h.opcode)) {
        c.after_write_ = false;
        if (v2 && !c.add_status(kTcpStatusOk)) return false;
        return c.add_data(mem, size, std::move(pin));
    }
    c.after_write_ = true;
    c.small_write_ = size <= Conn::kSmallPayload;
    if (c.pending_overlaps(mem, size) && !c.flush()) return false;
    IoResult io = c.read_payload(mem, size);
    if (!io.ok()) {
        log_failed(h, io.describe());
        return false;
    }
    pin.release();
    return !v2 || c.add_status(kTcpStatusOk);
}

}  // namespace mcrs
