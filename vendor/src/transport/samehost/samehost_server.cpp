#include "transport/samehost/samehost_server.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "transport/samehost/cma.h"
#include "transport/samehost/peer_identity.h"
#include "transport/samehost/samehost_wire.h"

namespace mcrs {

namespace {

// Requests read and answered per pass.
constexpr size_t kBatch = 256;

std::string describe(const SameHostRequest &r, pid_t pid) {
    std::ostringstream s;
    s << (r.opcode == kSameHostOpWrite ? "WRITE" : "READ") << " of " << r.length << " bytes at 0x"
      << std::hex << r.target_addr << std::dec << " for pid " << pid;
    return s.str();
}

}  // namespace

SameHostServer::SameHostServer(const MemoryRegistry &registry, SameHostServerOptions opt)
    : registry_(registry), opt_(opt) {
    std::string err;
    listener_ = listen_samehost(128, name_, err);
    if (!listener_.valid()) throw Error(kErrSocket, "same-host listener: " + err);
}

SameHostServer::~SameHostServer() { stop(); }

void SameHostServer::start() { acceptor_ = std::thread([this] { accept_loop(); }); }

void SameHostServer::stop() {
    if (stopping_.exchange(true)) return;
    wake_.wake();
    if (acceptor_.joinable()) acceptor_.join();
    std::list<std::unique_ptr<Session>> sessions;
    {
        std::lock_guard<std::mutex> g(mu_);
        sessions.swap(sessions_);
    }
    // Unblock and join every session: after stop() nothing touches
    // registered memory on a peer's behalf.
    for (auto &s : sessions) ::shutdown(s->fd.get(), SHUT_RDWR);
    for (auto &s : sessions)
        if (s->thread.joinable()) s->thread.join();
    listener_.reset();
}

void SameHostServer::reap_finished() {
    for (auto it = sessions_.begin(); it != sessions_.end();) {
        if ((*it)->done.load()) {
            if ((*it)->thread.joinable()) (*it)->thread.join();
            it = sessions_.erase(it);
        } else {
            ++it;
        }
    }
}

void SameHostServer::accept_loop() {
    while (!stopping_.load()) {
        int r = wait_readable(listener_.get(), wake_.read_fd(), -1);
        if (r < 0 || stopping_.load()) break;
        for (;;) {
            int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EINTR) continue;
                break;
            }
            Fd conn(fd);
            AttestedPeer peer;
            std::string why;
            if (!attest_initiator(fd, peer, why)) {
                refused_.fetch_add(1);
                MC_LOG(Info, "same-host server: refused a connection: " << why);
                continue;  // closed: the peer gets no greeting
            }
            std::lock_guard<std::mutex> g(mu_);
            reap_finished();
            if (sessions_.size() >= opt_.max_connections) {
                refused_.fetch_add(1);
                MC_LOG(Warn, "same-host server at its limit of " << opt_.max_connections
                                                                 << " connections; refusing one");
                continue;
            }
            set_io_timeouts(fd, static_cast<int>(opt_.progress_timeout_ms),
                            static_cast<int>(opt_.progress_timeout_ms));
            auto s = std::make_unique<Session>();
            s->fd = std::move(conn);
            s->pidfd = std::move(peer.pidfd);
            s->pid = peer.pid;
            Session *raw = s.get();
            sessions_.push_back(std::move(s));
            raw->thread = std::thread([this, raw] { serve(raw); });
        }
    }
}

// A request with its range check; the pin holds the target buffer
// registered until the copy is done.
struct SameHostServer::Checked {
    SameHostRequest req;
    RegionPin pin;
    uint32_t code = kSameHostOk;
};

void SameHostServer::serve(Session *s) {
    const int fd = s->fd.get();
    unsigned char in[kBatch * kSameHostRequestLen];
    unsigned char out[kBatch * kSameHostStatusLen];
    std::vector<Checked> batch(kBatch);
    std::vector<CmaPiece> pieces(kBatch);
    size_t have = 0;
    if (!may_attach(*s)) {
        ::shutdown(fd, SHUT_RDWR);
        s->done.store(true);
        return;
    }
    encode_samehost_status(kSameHostOk, out);
    // The greeting; a pid reused between the attestation and the check
    // above shows up here as an exited pidfd.
    bool ok = pidfd_alive(s->pidfd.get()) && send_all(fd, out, kSameHostStatusLen).ok();
    while (ok && !stopping_.load()) {
        if (have < kSameHostRequestLen) {
            if (!receive_more(*s, in, sizeof in, have)) break;
            continue;
        }
        size_t off = 0;
        bool close_after = false;
        const size_t nb = check_requests(*s, in, have, batch.data(), off, close_after);
        // The attested process must still be the one behind the pid right
        // before the copies: once it has exited, the pid may name another.
        if (!pidfd_alive(s->pidfd.get())) {
            MC_LOG(Info, "same-host server: pid " << s->pid << " has exited; closing");
            for (size_t i = 0; i < nb; ++i) batch[i].pin.release();
            break;
        }
        copy_requests(*s, batch.data(), nb, pieces.data());
        for (size_t i = 0; i < nb; ++i) {
            batch[i].pin.release();
            encode_samehost_status(batch[i].code, out + i * kSameHostStatusLen);
        }
        const size_t nout = nb;
        if (nout && !send_all(fd, out, nout * kSameHostStatusLen).ok()) ok = false;
        if (close_after) break;
        std::memmove(in, in + off, have - off);
        have -= off;
    }
    ::shutdown(fd, SHUT_RDWR);
    s->done.store(true);
}

bool SameHostServer::may_attach(const Session &s) {
    // The kernel must also let us copy to and from it (ptrace rules: e.g. a
    // non-dumpable peer). If not, no greeting: the peer falls back to TCP.
    // Checked here rather than at accept: it touches /proc.
    if (int err = cma_check_access(s.pid)) {
        refused_.fetch_add(1);
        MC_LOG(Info, "same-host server: refused pid " << s.pid
                                                      << ": cannot attach to it for copies: " << errno_string(err));
        return false;
    }
    return true;
}

bool SameHostServer::receive_more(const Session &s, unsigned char *in, size_t cap, size_t &have) {
    const int fd = s.fd.get();
    // Idle between requests, bounded progress inside one.
    int wait_ms = static_cast<int>(have == 0 ? opt_.idle_timeout_ms : opt_.progress_timeout_ms);
    int r = wait_readable(fd, wake_.read_fd(), wait_ms);
    if (r == 0) {
        MC_LOG(Info, "same-host server: closing the connection of pid "
                         << s.pid << (have == 0 ? ": idle" : ": a request stalled"));
        return false;
    }
    if (r < 0) return false;
    ssize_t n = ::recv(fd, in + have, cap - have, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) {
        if (n == 0 && have != 0)
            MC_LOG(Info, "same-host server: pid " << s.pid << " closed inside a request");
        return false;
    }
    have += static_cast<size_t>(n);
    return true;
}

size_t SameHostServer::check_requests(const Session &s, const unsigned char *in, size_t have,
                                      Checked *batch, size_t &off, bool &close_after) {
    // Pass 1: decode and range-check every whole request that arrived,
    // up to the first one refused (which closes the connection).
    size_t nb = 0;
    while (have - off >= kSameHostRequestLen) {
        Checked &c = batch[nb++];
        c.code = kSameHostOk;
        std::string why;
        if (!decode_samehost_request(in + off, kSameHostRequestLen, c.req, why)) {
            rejected_.fetch_add(1);
            MC_LOG(Warn, "same-host server: malformed request from pid " << s.pid << ": " << why);
            c.code = kSameHostRejected;
        } else {
            // The one range check, as for TCP; host memory only.
            c.pin = registry_.pin(c.req.target_addr, c.req.length, /*need_remote=*/true);
            if (!c.pin || c.pin.region()->device >= 0) {
                rejected_.fetch_add(1);
                MC_LOG(Warn, "same-host server: rejected " << describe(c.req, s.pid)
                                                           << ": not inside one registered "
                                                              "remote-accessible host buffer");
                c.code = kSameHostRejected;
                c.pin.release();
            }
        }
        off += kSameHostRequestLen;
        if (c.code == kSameHostRejected) {
            close_after = true;  // the peer named memory it may not touch
            break;
        }
    }
    return nb;
}

void SameHostServer::copy_requests(const Session &s, Checked *batch, size_t nb, CmaPiece *pieces) {
    // Pass 2: each run of accepted requests in one direction is one
    // vectored copy (many requests per system call, not one each).
    for (size_t i = 0; i < nb;) {
        if (batch[i].code != kSameHostOk) {
            ++i;
            continue;
        }
        const uint8_t op = batch[i].req.opcode;
        size_t cnt = 0;
        while (i + cnt < nb && batch[i + cnt].code == kSameHostOk && batch[i + cnt].req.opcode == op) {
            const SameHostRequest &r = batch[i + cnt].req;
            pieces[cnt] = CmaPiece{reinterpret_cast<void *>(r.target_addr), r.initiator_addr,
                                   static_cast<size_t>(r.length)};
            ++cnt;
        }
        int err = 0;
        // READ: target -> initiator, so the peer's memory is written.
        size_t done = cma_copy_many(s.pid, op == kSameHostOpRead, pieces, cnt, err);
        served_.fetch_add(done, std::memory_order_relaxed);
        if (done < cnt) {
            Checked &bad = batch[i + done];
            MC_LOG(Info, "same-host server: " << describe(bad.req, s.pid)
                                              << ": the copy failed: " << errno_string(err));
            bad.code = kSameHostCopyFailed;
            ++done;  // the rest of the run is retried from the next one
        }
        i += done;
    }
}

}  // namespace mcrs
