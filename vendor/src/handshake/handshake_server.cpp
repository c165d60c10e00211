#include "handshake/handshake_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "handshake/frame.h"

namespace mcrs {

using Clock = std::chrono::steady_clock;

struct HandshakeServer::Conn {
    enum class State { ReadHeader, ReadBody, Write, Drain };
    Fd fd;
    std::string source;
    State state = State::ReadHeader;
    unsigned char header[kFrameHeaderLen];
    size_t header_got = 0;
    uint64_t length = 0;
    std::string body;
    std::string out;
    size_t sent = 0;
    Clock::time_point deadline;
};

HandshakeServer::HandshakeServer(Fd listener, HandshakeServerOptions opt, Handler handler)
    : listener_(std::move(listener)),
      opt_(std::move(opt)),
      handler_(std::move(handler)),
      admission_("handshake listener", opt_.allowed_peers, opt_.max_connections, opt_.max_connections_per_source) {
    set_nonblocking(listener_.get(), true);
}

void HandshakeServer::erase(std::list<Conn>::iterator it) {
    admission_.released(it->source);
    conns_.erase(it);
}

HandshakeServer::~HandshakeServer() { stop(); }

void HandshakeServer::start() { thread_ = std::thread([this] { run(); }); }

void HandshakeServer::stop() {
    if (!thread_.joinable()) return;
    stopping_.store(true);
    wake_.wake();
    thread_.join();
    conns_.clear();
    admission_.clear();
}

void HandshakeServer::accept_all() {
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int fd = ::accept4(listener_.get(), reinterpret_cast<sockaddr *>(&ss), &len,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                MC_LOG(Warn, "handshake accept(): " << errno_string(errno));
            return;
        }
        Fd guard(fd);
        std::string src = source_key(ss);
        if (const char *why = admission_.refusal(src)) {
            admission_.refuse(src, why);
            continue;
        }
        if (conns_.size() >= opt_.max_connections) {
            // Shed the oldest connection: it is the one most likely to be idle.
            admission_.refuse(conns_.front().source, "the listener was full and this was its oldest connection (dropped)");
            erase(conns_.begin());
        }
        conns_.emplace_back();
        Conn &c = conns_.back();
        c.fd = std::move(guard);
        c.source = src;
        admission_.admitted(src);
        c.deadline = Clock::now() + std::chrono::milliseconds(opt_.timeout_ms);
    }
}

void HandshakeServer::build_reply(Conn &c) {
    FrameBody fb = split_frame_body(c.body);
    uint8_t dispatch_type = fb.type == kHsOldProtocol ? static_cast<uint8_t>(kHsConnection) : fb.type;
    Json request;
    try {
        request = Json::parse(fb.json);
    } catch (const Error &e) {
        MC_LOG(Info, "handshake: dropping a " << handshake_type_name(fb.type)
                                              << " request with bad JSON: " << e.what());
        c.out.clear();
        return;
    }
    Json reply;
    bool ok = false;
    try {
        ok = handler_(dispatch_type, request, reply);
    } catch (const std::exception &e) {
        MC_LOG(Warn, "handshake handler failed: " << e.what());
        ok = false;
    }
    if (!ok) {
        c.out.clear();
        return;
    }
    c.out = encode_frame(fb.type, reply.dump() + "\n");
}

bool HandshakeServer::on_readable(Conn &c) {
    char buf[65536];
    for (;;) {
        if (c.state == Conn::State::ReadHeader) {
            ssize_t n = ::recv(c.fd.get(), c.header + c.header_got, kFrameHeaderLen - c.header_got,
                               MSG_DONTWAIT);
            if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
            if (n == 0) return false;
            c.header_got += static_cast<size_t>(n);
            if (c.header_got < kFrameHeaderLen) continue;
            c.length = decode_frame_length(c.header);
            if (c.length == 0 || c.length > opt_.max_length) {
                MC_LOG(Info, "handshake: dropping a frame of invalid length "
                                 << c.length << " (limit " << opt_.max_length << ")");
                return false;
            }
            c.state = Conn::State::ReadBody;
        } else if (c.state == Conn::State::ReadBody) {
            size_t want = static_cast<size_t>(c.length) - c.body.size();
            if (want > sizeof buf) want = sizeof buf;
            ssize_t n = ::recv(c.fd.get(), buf, want, MSG_DONTWAIT);
            if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
            if (n == 0) return false;
            c.body.append(buf, static_cast<size_t>(n));
            if (c.body.size() < c.length) continue;
            build_reply(c);
            if (c.out.empty()) return false;
            c.state = Conn::State::Write;
            return on_writable(c);
        } else if (c.state == Conn::State::Drain) {
            ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
            if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
            if (n == 0) return false;  // client closed: done
            // Extra bytes after the request are discarded.
        } else {
            return true;
        }
    }
}

bool HandshakeServer::on_writable(Conn &c) {
    while (c.sent < c.out.size()) {
        ssize_t n = ::send(c.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent,
                           MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
        c.sent += static_cast<size_t>(n);
    }
    ::shutdown(c.fd.get(), SHUT_WR);
    c.state = Conn::State::Drain;
    return true;
}

void HandshakeServer::run() {
    std::vector<struct pollfd> pfds;
    std::vector<std::list<Conn>::iterator> index;
    while (!stopping_) {
        pfds.clear();
        index.clear();
        pfds.push_back({wake_.read_fd(), POLLIN, 0});
        pfds.push_back({listener_.get(), POLLIN, 0});
        auto now = Clock::now();
        int timeout = -1;
        for (auto it = conns_.begin(); it != conns_.end();) {
            if (it->deadline <= now) {
                auto dead = it++;
                erase(dead);
                continue;
            }
            short ev = it->state == Conn::State::Write ? POLLOUT : POLLIN;
            pfds.push_back({it->fd.get(), ev, 0});
            index.push_back(it);
            auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(it->deadline - now)
                          .count() + 1;
            if (timeout < 0 || ms < timeout) timeout = static_cast<int>(ms);
            ++it;
        }
        int r = ::poll(pfds.data(), static_cast<nfds_t>(pfds.size()), timeout);
        if (r < 0) {
            if (errno == EINTR) continue;
            MC_LOG(Error, "handshake poll(): " << errno_string(errno));
            break;
        }
        if (stopping_) break;
        for (size_t i = 0; i < index.size(); ++i) {
            short re = pfds[i + 2].revents;
            if (!re) continue;
            Conn &c = *index[i];
            bool keep;
            if (re & (POLLERR | POLLNVAL)) keep = false;
            else if (c.state == Conn::State::Write) keep = on_writable(c);
            else keep = on_readable(c);
            if (!keep) erase(index[i]);
        }
        if (pfds[1].revents & POLLIN) accept_all();
    }
}

}  // namespace mcrs
