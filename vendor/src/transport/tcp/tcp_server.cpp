#include "transport/tcp/tcp_server.h"

#include <sys/socket.h>

#include <cerrno>
#include <sstream>

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

void discard(int fd, uint64_t n) {
    char buf[65536];
    while (n > 0) {
        size_t want = n < sizeof buf ? static_cast<size_t>(n) : sizeof buf;
        if (!recv_all(fd, buf, want).ok()) return;
        n -= want;
    }
}

std::string describe_request(const TcpHeader &h) {
    std::ostringstream s;
    s << (tcp_is_write(h.opcode) ? "WRITE" : "READ") << " of " << h.size << " bytes at 0x"
      << std::hex << h.addr;
    return s.str();
}
}  // namespace

void TcpServer::serve(Session *s) {
    const int fd = s->fd.get();
    unsigned char hdr[kTcpHeaderLen];
    while (!stopping_.load()) {
        // Idle between requests: wait without a deadline (peers pool their
        // connections), but wake for shutdown.
        int r = wait_readable(fd, wake_.read_fd(), -1);
        if (r <= 0) break;
        IoResult io = recv_all(fd, hdr, sizeof hdr);
        if (!io.ok()) {
            if (!(io.status == IoStatus::Eof && io.done == 0))
                MC_LOG(Info, "TCP server: dropping a connection while reading a header: "
                                 << io.describe());
            break;
        }
        TcpHeader h = decode_tcp_header(hdr);
        const bool v2 = tcp_is_v2(h.opcode);
        const bool write = tcp_is_write(h.opcode);
        RegionPin pin = registry_.pin(h.addr, h.size, /*need_remote=*/true);
        if (!pin) {
            rejected_.fetch_add(1);
            MC_LOG(Warn, "TCP server: rejected " << describe_request(h)
                                                 << ": not inside one registered "
                                                    "remote-accessible buffer");
            if (v2) {
                unsigned char st[8];
                put_le64(st, encode_tcp_status(kTcpStatusRejected));
                send_all(fd, st, sizeof st);
            }
            // A rejected WRITE's payload is still on its way. Discard a
            // modest one so our close is a FIN, not a reset that could
            // destroy the reject frame before the peer reads it.
            if (write && h.size <= kMaxDrainBytes) discard(fd, h.size);
            break;  // close: the peer's stream position is unknown from here
        }
        served_.fetch_add(1, std::memory_order_relaxed);
        char *mem = reinterpret_cast<char *>(h.addr);
        const int device = pin.region()->device;
        if (device >= 0) {
            // GPU memory: staged through pinned buffers, chunk by chunk.
            std::string err;
            if (!write) {
                unsigned char st[8];
                put_le64(st, encode_tcp_status(kTcpStatusOk));
                if (v2 && !send_all(fd, st, sizeof st).ok()) break;
                io = gpu::send_from_device(fd, mem, static_cast<size_t>(h.size), device, err);
            } else {
                io = gpu::recv_into_device(fd, mem, static_cast<size_t>(h.size), device, err);
                pin.release();
                if (io.ok() && v2) {
                    unsigned char st[8];
                    put_le64(st, encode_tcp_status(kTcpStatusOk));
                    io = send_all(fd, st, sizeof st);
                }
            }
            if (!io.ok()) {
                MC_LOG(Info, "TCP server: " << describe_request(h) << " (GPU " << device
                                             << ") failed: " << (err.empty() ? io.describe() : err));
                break;
            }
            continue;
        }
        if (!write) {
            unsigned char st[8];
            put_le64(st, encode_tcp_status(kTcpStatusOk));
            struct iovec iov[2];
            int n = 0;
            if (v2) iov[n++] = {st, sizeof st};
            iov[n++] = {mem, static_cast<size_t>(h.size)};
            io = sendv_all(fd, iov, n);
            if (!io.ok()) {
                MC_LOG(Info, "TCP server: " << describe_request(h) << " failed: " << io.describe());
                break;
            }
        } else {
            io = recv_all(fd, mem, static_cast<size_t>(h.size));
            if (!io.ok()) {
                MC_LOG(Info, "TCP server: " << describe_request(h) << " failed: " << io.describe());
                break;
            }
            pin.release();
            if (v2) {
                unsigned char st[8];
                put_le64(st, encode_tcp_status(kTcpStatusOk));
                io = send_all(fd, st, sizeof st);
                if (!io.ok()) break;
            }
        }
    }
    // Send FIN now; the reaper closes the descriptor later.
    ::shutdown(fd, SHUT_RDWR);
    s->done.store(true);
}

}  // namespace mcrs
