#include "metadata/http_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/host_port.h"

namespace mcrs {

// ---- Deadline-bounded socket I/O --------------------------------------------

std::string IoOutcome::describe() const {
    switch (end) {
        case IoEnd::Ok: return "ok";
        case IoEnd::Eof: return "connection closed by the server";
        case IoEnd::Timeout: return "timed out";
        case IoEnd::Cancelled: return "cancelled (shutting down)";
        case IoEnd::Error: return errno_string(err);
    }
    return "?";
}

int ms_until(MdClock::time_point deadline) {
    auto now = MdClock::now();
    if (now >= deadline) return 0;
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now).count();
    long long ms = (us + 999) / 1000;
    return ms > 0x7fffffff ? 0x7fffffff : static_cast<int>(ms);
}

namespace {

bool cancelled(const IoDeadline &dl) {
    if (dl.cancel_fd < 0) return false;
    struct pollfd p {dl.cancel_fd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
}

// Waits for `events` on fd until `until` (or the cancel fd): Ok (ready,
// errors included: the next call reports them), Timeout, Cancelled, Error.
IoEnd wait_fd(int fd, short events, MdClock::time_point until, int cancel_fd, int &err) {
    for (;;) {
        int left = ms_until(until);
        if (left <= 0) return IoEnd::Timeout;
        struct pollfd p[2];
        p[0] = {fd, events, 0};
        p[1] = {cancel_fd, POLLIN, 0};
        nfds_t n = cancel_fd >= 0 ? 2 : 1;
        int r = ::poll(p, n, left);
        if (r < 0) {
            if (errno == EINTR) continue;
            err = errno;
            return IoEnd::Error;
        }
        if (r == 0) continue;  // the loop re-checks the deadline
        if (n == 2 && p[1].revents) return IoEnd::Cancelled;
        return IoEnd::Ok;
    }
}

bool connect_addr(const struct addrinfo *ai, MdClock::time_point until, int cancel_fd, Fd &out,
                  std::string &why, bool &was_cancelled) {
    Fd s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s.valid()) {
        why = "socket(): " + errno_string(errno);
        return false;
    }
    if (!set_nonblocking(s.get(), true)) {
        why = "fcntl(O_NONBLOCK): " + errno_string(errno);
        return false;
    }
    int rc = ::connect(s.get(), ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno != EINPROGRESS) {
        why = errno_string(errno);
        return false;
    }
    if (rc != 0) {
        int err = 0;
        IoEnd w = wait_fd(s.get(), POLLOUT, until, cancel_fd, err);
        if (w == IoEnd::Timeout) {
            why = "connect timed out";
            return false;
        }
        if (w == IoEnd::Cancelled) {
            was_cancelled = true;
            why = "cancelled (shutting down)";
            return false;
        }
        if (w == IoEnd::Error) {
            why = "poll(): " + errno_string(err);
            return false;
        }
        int soerr = 0;
        socklen_t len = sizeof soerr;
        ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &soerr, &len);
        if (soerr != 0) {
            why = errno_string(soerr);
            return false;
        }
    }
    // The socket stays non-blocking: every read and write below waits in
    // poll() with the time left.
    set_nodelay(s.get());
    out = std::move(s);
    return true;
}

}  // namespace

Fd connect_until(const std::string &host, uint16_t port, uint32_t connect_timeout_ms,
                 const IoDeadline &dl, std::string &why) {
    if (cancelled(dl)) {
        why = "cancelled (shutting down)";
        return Fd();
    }
    auto until = std::min(dl.deadline, MdClock::now() + std::chrono::milliseconds(connect_timeout_ms));
    const int budget_ms = ms_until(until);
    if (budget_ms <= 0) {
        why = "no time left to connect";
        return Fd();
    }
    AddrList res = resolve_tcp(host, port, budget_ms, why);
    if (!res) return Fd();
    Fd out;
    bool was_cancelled = false;
    for (struct addrinfo *ai = res.get(); ai && !was_cancelled; ai = ai->ai_next) {
        if (connect_addr(ai, until, dl.cancel_fd, out, why, was_cancelled)) break;
    }
    if (!out.valid() && !was_cancelled && MdClock::now() >= until)
        why = "connect timed out after " + std::to_string(budget_ms) + " ms";
    return out;
}

IoOutcome send_all_until(int fd, std::string_view data, const IoDeadline &dl) {
    IoOutcome r;
    while (r.bytes < data.size()) {
        ssize_t n = ::send(fd, data.data() + r.bytes, data.size() - r.bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            r.bytes += static_cast<size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            r.end = IoEnd::Error;
            r.err = errno;
            return r;
        }
        int err = 0;
        IoEnd w = wait_fd(fd, POLLOUT, dl.deadline, dl.cancel_fd, err);
        if (w != IoEnd::Ok) {
            r.end = w;
            r.err = err;
            return r;
        }
    }
    return r;
}

IoOutcome recv_some_until(int fd, std::string &out, size_t cap, const IoDeadline &dl) {
    IoOutcome r;
    if (cap == 0) return r;
    size_t old = out.size();
    for (;;) {
        out.resize(old + cap);
        ssize_t n = ::recv(fd, &out[old], cap, MSG_DONTWAIT);
        if (n > 0) {
            out.resize(old + static_cast<size_t>(n));
            r.bytes = static_cast<size_t>(n);
            return r;
        }
        out.resize(old);
        if (n == 0) {
            r.end = IoEnd::Eof;
            return r;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            r.end = IoEnd::Error;
            r.err = errno;
            return r;
        }
        int err = 0;
        IoEnd w = wait_fd(fd, POLLIN, dl.deadline, dl.cancel_fd, err);
        if (w != IoEnd::Ok) {
            r.end = w;
            r.err = err;
            return r;
        }
    }
}

// ---- HTTP response parser ----------------------------------------------------

namespace {

bool is_tchar(unsigned char c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
    return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != 0;
}

// Field values and reason phrases: HTAB, visible ASCII, SP, obs-text.
bool is_field_text(std::string_view s) {
    for (unsigned char c : s)
        if (!(c == '\t' || (c >= 0x20 && c != 0x7f))) return false;
    return true;
}

std::string trim_ows(std::string_view s) {
    size_t b = 0, e = s.size();
    while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
    while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
    return std::string(s.substr(b, e - b));
}

std::string lower(std::string_view s) {
    std::string out(s);
    for (char &c : out)
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    return out;
}

constexpr size_t kMaxChunkLine = 1024;

}  // namespace

const std::string *HttpResponse::header(std::string_view lower_name) const {
    for (const auto &h : headers)
        if (h.first == lower_name) return &h.second;
    return nullptr;
}

HttpResponseParser::HttpResponseParser(const HttpLimits &limits, std::string server)
    : lim_(limits), server_(std::move(server)) {}

void HttpResponseParser::fail(const std::string &why) const {
    throw Error(kErrMetadata, "malformed HTTP response from " + server_ + ": " + why);
}

bool HttpResponseParser::take_line(std::string &line, size_t max) {
    size_t avail = buf_.size() - buf_pos_;
    const char *p = buf_.data() + buf_pos_;
    // A line of `max` bytes plus CRLF.
    size_t look = std::min(avail, max + 2);
    const void *nl = std::memchr(p, '\n', look);
    if (!nl) {
        if (avail >= max + 2) fail("line longer than " + std::to_string(max) + " bytes");
        return false;
    }
    size_t len = static_cast<size_t>(static_cast<const char *>(nl) - p);
    size_t consumed = len + 1;
    if (len > 0 && p[len - 1] == '\r') --len;
    if (len > max) fail("line longer than " + std::to_string(max) + " bytes");
    line.assign(p, len);
    buf_pos_ += consumed;
    return true;
}

void HttpResponseParser::status_line(const std::string &line) {
    // HTTP/1.x SP 3DIGIT [SP reason]
    if (line.size() < 12 || line.compare(0, 7, "HTTP/1.") != 0 || !(line[7] >= '0' && line[7] <= '9') ||
        line[8] != ' ')
        fail("bad status line '" + excerpt_for_message(line, 80) + "'");
    int code = 0;
    for (int i = 9; i < 12; ++i) {
        if (line[i] < '0' || line[i] > '9') fail("bad status code in '" + excerpt_for_message(line, 80) + "'");
        code = code * 10 + (line[i] - '0');
    }
    if (code < 100 || code > 599) fail("status code " + std::to_string(code) + " out of range");
    if (line.size() > 12) {
        if (line[12] != ' ') fail("bad status line '" + excerpt_for_message(line, 80) + "'");
        std::string_view reason(line.data() + 13, line.size() - 13);
        if (!is_field_text(reason)) fail("control character in the reason phrase");
        resp_.reason = trim_ows(reason);
    }
    resp_.status = code;
}

void HttpResponseParser::header_line(const std::string &line) {
    if (line[0] == ' ' || line[0] == '\t') fail("folded header line (obsolete line folding)");
    if (++header_lines_ > lim_.max_header_lines)
        fail("more than " + std::to_string(lim_.max_header_lines) + " header lines");
    size_t colon = line.find(':');
    if (colon == std::string::npos || colon == 0)
        fail("header line without a name: '" + excerpt_for_message(line, 80) + "'");
    for (size_t i = 0; i < colon; ++i)
        if (!is_tchar(static_cast<unsigned char>(line[i])))
            fail("bad header name '" + excerpt_for_message(line.substr(0, colon), 80) + "'");
    std::string_view value(line.data() + colon + 1, line.size() - colon - 1);
    if (!is_field_text(value)) fail("control character in header " + line.substr(0, colon));
    if (state_ == State::Headers) resp_.headers.emplace_back(lower(line.substr(0, colon)), trim_ows(value));
}

void HttpResponseParser::head_complete() {
    if (resp_.status >= 100 && resp_.status < 200) {
        if (resp_.status == 101) fail("unexpected 101 Switching Protocols");
        if (++interim_ > lim_.max_interim) fail("too many interim (1xx) answers");
        resp_ = HttpResponse();
        header_lines_ = 0;
        head_bytes_ = 0;
        state_ = State::StatusLine;
        return;
    }
    // Transfer-Encoding: only "chunked" (alone) is supported; it overrides
    // Content-Length.
    bool has_te = false, chunked = false;
    std::string length;
    bool has_length = false;
    for (const auto &h : resp_.headers) {
        if (h.first == "transfer-encoding") {
            size_t start = 0;
            const std::string &v = h.second;
            while (start <= v.size()) {
                size_t comma = v.find(',', start);
                if (comma == std::string::npos) comma = v.size();
                std::string coding = lower(trim_ows(std::string_view(v).substr(start, comma - start)));
                start = comma + 1;
                if (coding.empty()) continue;
                if (coding != "chunked" || chunked)
                    fail("unsupported transfer coding '" + excerpt_for_message(coding, 40) + "'");
                chunked = true;
                has_te = true;
            }
        } else if (h.first == "content-length") {
            // Repeated or listed values must all agree.
            size_t start = 0;
            const std::string &v = h.second;
            while (start <= v.size()) {
                size_t comma = v.find(',', start);
                if (comma == std::string::npos) comma = v.size();
                std::string one = trim_ows(std::string_view(v).substr(start, comma - start));
                start = comma + 1;
                if (has_length && one != length) fail("conflicting Content-Length values");
                length = one;
                has_length = true;
            }
        }
    }
    if (has_te && !chunked) fail("unsupported transfer coding");
    if (resp_.status == 204 || resp_.status == 304) {
        state_ = State::Done;
        return;
    }
    if (chunked) {
        state_ = State::ChunkSize;
        return;
    }
    if (has_length) {
        if (length.empty() || length.size() > 19) fail("bad Content-Length '" + excerpt_for_message(length, 40) + "'");
        uint64_t n = 0;
        for (char c : length) {
            if (c < '0' || c > '9') fail("bad Content-Length '" + excerpt_for_message(length, 40) + "'");
            n = n * 10 + static_cast<uint64_t>(c - '0');
        }
        if (n > lim_.max_body_bytes)
            throw Error(kErrMetadata, "answer from " + server_ + " too large: Content-Length " +
                                          std::to_string(n) + " over the limit of " +
                                          std::to_string(lim_.max_body_bytes) + " bytes");
        body_left_ = n;
        resp_.body.reserve(static_cast<size_t>(std::min<uint64_t>(n, 64 * 1024)));
        state_ = n == 0 ? State::Done : State::Body;
        return;
    }
    state_ = State::BodyToEof;
}

void HttpResponseParser::chunk_size_line(const std::string &line) {
    size_t i = 0;
    uint64_t n = 0;
    auto hexval = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    for (; i < line.size(); ++i) {
        int v = hexval(line[i]);
        if (v < 0) break;
        if (n > (UINT64_MAX >> 4)) fail("chunk size overflows 64 bits");
        n = (n << 4) | static_cast<uint64_t>(v);
    }
    if (i == 0) fail("bad chunk size line '" + excerpt_for_message(line, 40) + "'");
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    if (i < line.size()) {
        if (line[i] != ';' || !is_field_text(std::string_view(line).substr(i)))
            fail("bad chunk size line '" + excerpt_for_message(line, 40) + "'");
    }
    if (n == 0) {
        state_ = State::Trailers;
        return;
    }
    if (n > lim_.max_body_bytes - resp_.body.size())
        throw Error(kErrMetadata, "answer from " + server_ + " too large: chunked body over the limit of " +
                                      std::to_string(lim_.max_body_bytes) + " bytes");
    body_left_ = n;
    state_ = State::ChunkData;
}

void HttpResponseParser::append_body(const char *p, size_t n) {
    if (n > lim_.max_body_bytes - resp_.body.size())
        throw Error(kErrMetadata, "answer from " + server_ + " too large: body over the limit of " +
                                      std::to_string(lim_.max_body_bytes) + " bytes");
    resp_.body.append(p, n);
}

void HttpResponseParser::body_progress() {
    if (body_complete_ && state_ != State::Done && body_complete_(resp_.body)) state_ = State::Done;
}

bool HttpResponseParser::feed(const char *data, size_t n) {
    received_ += n;
    if (state_ == State::Done) return true;
    buf_.append(data, n);
    std::string line;
    bool more = true;
    while (more && state_ != State::Done) {
        size_t avail = buf_.size() - buf_pos_;
        switch (state_) {
            case State::StatusLine:
            case State::Headers: {
                size_t budget = lim_.max_head_bytes > head_bytes_ ? lim_.max_head_bytes - head_bytes_ : 0;
                size_t before = buf_pos_;
                if (budget < 2) fail("response head larger than " + std::to_string(lim_.max_head_bytes) + " bytes");
                bool got = false;
                try {
                    got = take_line(line, budget - 2);
                } catch (const Error &) {
                    fail("response head larger than " + std::to_string(lim_.max_head_bytes) + " bytes");
                }
                if (!got) {
                    more = false;
                    break;
                }
                head_bytes_ += buf_pos_ - before;
                if (state_ == State::StatusLine) {
                    // Tolerate empty lines before the status line (RFC 9112 2.2).
                    if (line.empty()) break;
                    status_line(line);
                    state_ = State::Headers;
                } else if (line.empty()) {
                    head_complete();
                } else {
                    header_line(line);
                }
                break;
            }
            case State::Body:
            case State::ChunkData: {
                if (avail == 0) {
                    more = false;
                    break;
                }
                size_t take = static_cast<size_t>(std::min<uint64_t>(avail, body_left_));
                append_body(buf_.data() + buf_pos_, take);
                buf_pos_ += take;
                body_left_ -= take;
                if (body_left_ == 0) state_ = state_ == State::Body ? State::Done : State::ChunkEnd;
                body_progress();
                break;
            }
            case State::BodyToEof:
                if (avail == 0) {
                    more = false;
                    break;
                }
                append_body(buf_.data() + buf_pos_, avail);
                buf_pos_ += avail;
                body_progress();
                break;
            case State::ChunkSize:
                if (!take_line(line, kMaxChunkLine)) {
                    more = false;
                    break;
                }
                chunk_size_line(line);
                break;
            case State::ChunkEnd: {
                // CRLF (or a bare LF) after the chunk's data.
                const char *p = buf_.data() + buf_pos_;
                if (avail == 0 || (p[0] == '\r' && avail == 1)) {
                    more = false;
                    break;
                }
                if (p[0] == '\n') {
                    buf_pos_ += 1;
                } else if (p[0] == '\r' && p[1] == '\n') {
                    buf_pos_ += 2;
                } else {
                    fail("chunk data longer than its chunk size (no CRLF after it)");
                }
                state_ = State::ChunkSize;
                break;
            }
            case State::Trailers: {
                size_t budget = lim_.max_head_bytes > trailer_bytes_ ? lim_.max_head_bytes - trailer_bytes_ : 0;
                if (budget < 2) fail("trailers larger than " + std::to_string(lim_.max_head_bytes) + " bytes");
                size_t before = buf_pos_;
                if (!take_line(line, budget - 2)) {
                    more = false;
                    break;
                }
                trailer_bytes_ += buf_pos_ - before;
                if (line.empty()) {
                    state_ = State::Done;
                } else {
                    header_line(line);  // checked, not kept
                }
                break;
            }
            case State::Done: break;
        }
    }
    if (state_ == State::Done || buf_pos_ == buf_.size()) {
        buf_.clear();
        buf_pos_ = 0;
    } else if (buf_pos_ > 4096 && buf_pos_ * 2 > buf_.size()) {
        buf_.erase(0, buf_pos_);
        buf_pos_ = 0;
    }
    return state_ == State::Done;
}

void HttpResponseParser::finish_eof() {
    switch (state_) {
        case State::Done: return;
        case State::BodyToEof: state_ = State::Done; return;
        case State::StatusLine:
            if (received_ == 0) throw Error(kErrMetadata, server_ + " closed the connection without answering");
            [[fallthrough]];
        case State::Headers:
            fail("connection closed inside the response head (" + std::to_string(received_) + " bytes received)");
        case State::Body:
            fail("connection closed after " + std::to_string(resp_.body.size()) + " body bytes, " +
                 std::to_string(body_left_) + " more announced");
        case State::ChunkSize:
        case State::ChunkData:
        case State::ChunkEnd:
        case State::Trailers: fail("connection closed inside the chunked body");
    }
}

HttpResponse parse_http_response(std::string_view bytes, const HttpLimits &limits, const std::string &server) {
    HttpResponseParser p(limits, server);
    if (!p.feed(bytes.data(), bytes.size())) p.finish_eof();
    return std::move(p.response());
}

// ---- HTTP request ------------------------------------------------------------

HttpResponse http_request(const std::string &host, uint16_t port, const HttpRequest &req,
                          const HttpLimits &limits, uint32_t connect_timeout_ms, const IoDeadline &dl) {
    const std::string server = join_host_port(host, port);
    std::string why;
    Fd fd = connect_until(host, port, connect_timeout_ms, dl, why);
    if (!fd.valid()) {
        if (cancelled(dl)) throw Error(kErrShutdown, "request to " + server + " cancelled (shutting down)");
        const bool timed_out = ms_until(dl.deadline) <= 0 || why.find("timed out") != std::string::npos;
        throw HttpError("cannot connect to " + server + ": " + why,
                        timed_out ? HttpError::Kind::Timeout : HttpError::Kind::Connect);
    }
    std::string msg;
    msg.reserve(256 + req.body.size());
    msg += req.method;
    msg += ' ';
    msg += req.target;
    msg += " HTTP/1.1\r\nHost: ";
    msg += server;
    msg += "\r\nUser-Agent: mooncake-rs-engine\r\nAccept: */*\r\nConnection: close\r\n";
    if (!req.content_type.empty()) msg += "Content-Type: " + req.content_type + "\r\n";
    if (req.send_body) msg += "Content-Length: " + std::to_string(req.body.size()) + "\r\n";
    msg += "\r\n";
    if (req.send_body) msg += req.body;
    IoOutcome s = send_all_until(fd.get(), msg, dl);
    if (s.end == IoEnd::Cancelled) throw Error(kErrShutdown, "request to " + server + " cancelled (shutting down)");
    if (s.end != IoEnd::Ok)
        throw HttpError("sending the request to " + server + " failed: " + s.describe() + " after " +
                            std::to_string(s.bytes) + " of " + std::to_string(msg.size()) + " bytes",
                        s.end == IoEnd::Timeout ? HttpError::Kind::Timeout : HttpError::Kind::Io);
    HttpResponseParser parser(limits, server);
    if (req.body_complete) parser.set_body_complete(req.body_complete);
    std::string chunk;
    try {
        while (!parser.done()) {
            chunk.clear();
            IoOutcome r = recv_some_until(fd.get(), chunk, 64 * 1024, dl);
            switch (r.end) {
                case IoEnd::Ok: parser.feed(chunk.data(), chunk.size()); break;
                case IoEnd::Eof: parser.finish_eof(); break;
                case IoEnd::Timeout:
                    throw HttpError("no complete answer from " + server + " before the deadline (" +
                                        std::to_string(parser.received()) + " bytes received)",
                                    HttpError::Kind::Timeout);
                case IoEnd::Cancelled:
                    throw Error(kErrShutdown, "request to " + server + " cancelled (shutting down)");
                case IoEnd::Error:
                    throw HttpError("reading the answer from " + server + " failed: " + r.describe(),
                                    HttpError::Kind::Io);
            }
        }
    } catch (const HttpError &) {
        throw;
    } catch (const Error &e) {
        if (e.code() != kErrMetadata) throw;
        throw HttpError(e.what(), HttpError::Kind::BadAnswer);  // the parser's
    }
    return std::move(parser.response());
}

// ---- URLs and messages -------------------------------------------------------

HttpUrl parse_http_url(const std::string &url) {
    auto bad = [&](const std::string &why) -> Error {
        return Error(kErrInvalidArgument, "bad HTTP URL '" + excerpt_for_message(url, 200) + "': " + why);
    };
    if (url.size() < 7 || lower(url.substr(0, 7)) != "http://") throw bad("expected http://host[:port][/path]");
    for (unsigned char c : url)
        if (c <= 0x20 || c == 0x7f) throw bad("spaces and control characters are not allowed");
    if (url.find('#') != std::string::npos) throw bad("fragments ('#') are not allowed");
    std::string rest = url.substr(7);
    size_t end = rest.find_first_of("/?");
    std::string authority = rest.substr(0, end);
    HttpUrl out;
    out.target = end == std::string::npos ? "/" : rest.substr(end);
    if (!out.target.empty() && out.target[0] == '?') out.target = "/" + out.target;
    if (authority.find('@') != std::string::npos) throw bad("user information is not supported");
    std::string port_s;
    if (!authority.empty() && authority[0] == '[') {
        size_t close = authority.find(']');
        if (close == std::string::npos) throw bad("unterminated '[' in the host");
        out.host = authority.substr(1, close - 1);
        if (!is_ipv6_literal(out.host)) throw bad("'" + out.host + "' is not an IPv6 address");
        if (close + 1 < authority.size()) {
            if (authority[close + 1] != ':') throw bad("unexpected text after ']'");
            port_s = authority.substr(close + 2);
            if (port_s.empty()) throw bad("empty port");
        }
    } else {
        size_t colon = authority.find(':');
        if (colon != std::string::npos && authority.find(':', colon + 1) != std::string::npos)
            throw bad("an IPv6 address must be written in brackets");
        out.host = authority.substr(0, colon);
        if (colon != std::string::npos) {
            port_s = authority.substr(colon + 1);
            if (port_s.empty()) throw bad("empty port");
        }
    }
    if (out.host.empty()) throw bad("no host");
    if (!port_s.empty()) {
        if (port_s.size() > 5) throw bad("bad port '" + port_s + "'");
        unsigned v = 0;
        for (char c : port_s) {
            if (c < '0' || c > '9') throw bad("bad port '" + port_s + "'");
            v = v * 10 + static_cast<unsigned>(c - '0');
        }
        if (v == 0 || v > 65535) throw bad("port " + port_s + " out of range");
        out.port = static_cast<uint16_t>(v);
    }
    return out;
}

std::string url_escape(std::string_view s) {
    static const char kHex[] = "0123456789ABCDEF";
    std::string out;
    out.reserve(s.size() * 3);
    for (unsigned char c : s) {
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
            c == '_' || c == '~') {
            out.push_back(static_cast<char>(c));
        } else {
            out.push_back('%');
            out.push_back(kHex[c >> 4]);
            out.push_back(kHex[c & 15]);
        }
    }
    return out;
}

std::string excerpt_for_message(std::string_view s, size_t max) {
    bool cut = s.size() > max;
    std::string out;
    out.reserve(std::min(s.size(), max) + 3);
    for (size_t i = 0; i < s.size() && i < max; ++i) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        if (c == '\r' || c == '\n' || c == '\t' || c == ' ') {
            if (out.empty() || out.back() != ' ') out.push_back(' ');
        } else if (c >= 0x20 && c < 0x7f) {
            out.push_back(static_cast<char>(c));
        } else {
            out.push_back('?');
        }
    }
    size_t b = 0, e = out.size();
    while (b < e && out[b] == ' ') ++b;
    while (e > b && out[e - 1] == ' ') --e;
    out = out.substr(b, e - b);
    if (cut) out += "...";
    return out;
}

}  // namespace mcrs
