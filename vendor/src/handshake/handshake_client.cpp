#include "handshake/handshake_client.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>

#include "common/error.h"
#include "common/host_port.h"
#include "common/socket.h"
#include "handshake/frame.h"

namespace mcrs {

namespace {

using Clock = std::chrono::steady_clock;

int remaining_ms(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return left.count() <= 0 ? 0 : static_cast<int>(left.count());
}

// Reads exactly `len` bytes before `deadline`, whatever the peer's pace.
void read_exact(int fd, char *buf, size_t len, Clock::time_point deadline,
                const std::string &peer) {
    size_t done = 0;
    while (done < len) {
        int left = remaining_ms(deadline);
        if (left == 0)
            throw Error(kErrSocket, "handshake with " + peer + " timed out waiting for the reply");
        struct pollfd p;
        p.fd = fd;
        p.events = POLLIN;
        p.revents = 0;
        int r = ::poll(&p, 1, left);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) throw Error(kErrSocket, "poll(): " + errno_string(errno));
        if (r == 0) continue;
        ssize_t n = ::recv(fd, buf + done, len - done, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            throw Error(kErrSocket, "reading the handshake reply from " + peer + ": " +
                                        errno_string(errno));
        }
        if (n == 0)
            throw Error(kErrSocket, "peer " + peer + " closed the handshake connection after " +
                                        std::to_string(done) + " of " + std::to_string(len) +
                                        " bytes");
        done += static_cast<size_t>(n);
    }
}

}  // namespace

Json handshake_request(const std::string &host, uint16_t port, uint8_t type, const Json &body,
                       const HandshakeClientOptions &opt) {
    const std::string peer = join_host_port(host, port);
    int code = 0;
    std::string err;
    Fd fd = connect_tcp(host, port, static_cast<int>(opt.connect_timeout_ms), code, err);
    if (!fd.valid()) throw Error(code, "handshake: " + err);
    auto deadline = Clock::now() + std::chrono::milliseconds(opt.timeout_ms);
    set_io_timeouts(fd.get(), static_cast<int>(opt.timeout_ms), static_cast<int>(opt.timeout_ms));

    std::string frame = encode_frame(type, body.dump() + "\n");
    IoResult w = send_all(fd.get(), frame.data(), frame.size());
    if (!w.ok())
        throw Error(kErrSocket, "sending the " + std::string(handshake_type_name(type)) +
                                    " request to " + peer + ": " + w.describe());

    unsigned char hdr[kFrameHeaderLen];
    read_exact(fd.get(), reinterpret_cast<char *>(hdr), sizeof hdr, deadline, peer);
    uint64_t len = decode_frame_length(hdr);
    if (len == 0 || len > opt.max_length)
        throw Error(kErrSocket, "peer " + peer + " sent a reply of invalid length " +
                                    std::to_string(len) + " (limit " +
                                    std::to_string(opt.max_length) + ")");
    std::string reply(static_cast<size_t>(len), '\0');
    read_exact(fd.get(), &reply[0], reply.size(), deadline, peer);
    FrameBody fb = split_frame_body(reply);
    if (type != kHsOldProtocol && fb.type != type)
        throw Error(kErrSocket, "peer " + peer + " answered a " + handshake_type_name(type) +
                                    " request with message type " +
                                    std::to_string(static_cast<int>(fb.type)));
    try {
        return Json::parse(fb.json);
    } catch (const Error &e) {
        throw Error(kErrMalformedJson, "reply from " + peer + ": " + e.what());
    }
}

}  // namespace mcrs
