// A small, bounded HTTP/1.1 client for the metadata stores (etcd's JSON
// gateway and upstream's HTTP metadata server), plus the deadline-bounded
// socket I/O that the Redis client shares.
//
// One request per connection ("Connection: close"). Everything is bounded:
// the connect (connect_timeout_ms, and never past the deadline), the whole
// call (one deadline), the response head (16 KiB by default, at most 100
// header lines), the body (a cap the caller gives; checked before reading
// when Content-Length announces it and while reading chunked or read-to-EOF
// bodies) and every chunk-size line. Malformed answers throw
// Error(kErrMetadata) naming the server; nothing aborts, nothing waits
// without a deadline.
//
// The response parser is separate from the sockets (HttpResponseParser,
// parse_http_response) so that it can be fed bytes directly (tests, fuzz).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/socket.h"

namespace mcrs {

using MdClock = std::chrono::steady_clock;

// ---- Deadline-bounded socket I/O --------------------------------------------

struct IoDeadline {
    MdClock::time_point deadline;
    // When >= 0 and readable, the wait ends at once with Cancelled (a store
    // being destroyed wakes its background thread this way).
    int cancel_fd = -1;
};

enum class IoEnd { Ok, Eof, Timeout, Cancelled, Error };

struct IoOutcome {
    IoEnd end = IoEnd::Ok;
    size_t bytes = 0;  // bytes moved by this call
    int err = 0;       // errno for Error
    std::string describe() const;
};

// Milliseconds left until `deadline`, rounded up; 0 once it has passed.
int ms_until(MdClock::time_point deadline);

// Connects with min(connect_timeout_ms, time left); an invalid Fd and
// `why` set on failure.
Fd connect_until(const std::string &host, uint16_t port, uint32_t connect_timeout_ms,
                 const IoDeadline &dl, std::string &why);
// Sends every byte of `data` before the deadline.
IoOutcome send_all_until(int fd, std::string_view data, const IoDeadline &dl);
// Waits for data and appends what is there (at most `cap` bytes) to `out`:
// Ok with bytes > 0, Eof, Timeout, Cancelled or Error.
IoOutcome recv_some_until(int fd, std::string &out, size_t cap, const IoDeadline &dl);

// ---- HTTP ----------------------------------------------------------------

struct HttpLimits {
    size_t max_head_bytes = 16 * 1024;  // status line and headers (and trailers)
    uint64_t max_body_bytes = 32ull << 20;
    size_t max_header_lines = 100;
    size_t max_interim = 4;  // 1xx answers skipped before the real one
};

struct HttpResponse {
    int status = 0;
    std::string reason;
    // Names lowercased, values trimmed, in arrival order.
    std::vector<std::pair<std::string, std::string>> headers;
    std::string body;
    // The first header of that (lowercase) name; nullptr when absent.
    const std::string *header(std::string_view lower_name) const;
};

// The answer to one request that is not HEAD, fed in pieces as they
// arrive. Malformed input throws Error(kErrMetadata, "malformed HTTP
// response from <server>: ..."). Bytes after a complete response are
// ignored.
class HttpResponseParser {
public:
    HttpResponseParser(const HttpLimits &limits, std::string server);

    // When set, the response is complete as soon as the body read so far
    // satisfies it (a streamed answer, e.g. etcd's lease keep-alive).
    void set_body_complete(std::function<bool(const std::string &)> fn) { body_complete_ = std::move(fn); }

    // Consumes bytes; true once the response is complete.
    bool feed(const char *data, size_t n);
    // The peer closed the connection: completes a body that runs to EOF,
    // throws for anything left incomplete.
    void finish_eof();
    bool done() const { return state_ == State::Done; }
    // Bytes received so far (for messages).
    uint64_t received() const { return received_; }
    HttpResponse &response() { return resp_; }

private:
    enum class State { StatusLine, Headers, Body, BodyToEof, ChunkSize, ChunkData, ChunkEnd, Trailers, Done };
    [[noreturn]] void fail(const std::string &why) const;
    // A whole line from buf_ (without CRLF/LF) when one is there; the line
    // may be at most `max` bytes long.
    bool take_line(std::string &line, size_t max);
    void status_line(const std::string &line);
    void header_line(const std::string &line);
    void head_complete();
    void chunk_size_line(const std::string &line);
    void append_body(const char *p, size_t n);
    void body_progress();

    HttpLimits lim_;
    std::string server_;
    std::function<bool(const std::string &)> body_complete_;
    State state_ = State::StatusLine;
    std::string buf_;  // bytes not yet consumed by a line-based state
    size_t buf_pos_ = 0;
    uint64_t received_ = 0;
    size_t head_bytes_ = 0;
    size_t header_lines_ = 0;
    size_t interim_ = 0;
    size_t trailer_bytes_ = 0;
    uint64_t body_left_ = 0;  // Body: bytes still to come; ChunkData: of this chunk
    HttpResponse resp_;
};

// Everything a server sent before closing, parsed as one response.
HttpResponse parse_http_response(std::string_view bytes, const HttpLimits &limits,
                                 const std::string &server);

struct HttpRequest {
    std::string method = "GET";
    std::string target = "/";  // path and query, already escaped
    // Sent with Content-Length when `send_body` (PUT, POST), even if empty.
    bool send_body = false;
    std::string body;
    std::string content_type;  // no Content-Type header when empty
    std::function<bool(const std::string &)> body_complete;  // see HttpResponseParser
};

// A failed request: Error(kErrMetadata) plus what is known of the failure,
// so that a caller with several servers can tell "nobody there" from "no
// answer in time".
class HttpError : public Error {
public:
    enum class Kind {
        Connect,    // no connection (refused, unreachable, name unknown)
        Timeout,    // the deadline or the connect timeout ran out
        Io,         // the connection failed while sending or receiving
        BadAnswer,  // an answer came and was malformed, cut short or too large
    };
    HttpError(const std::string &message, Kind kind) : Error(kErrMetadata, message), kind_(kind) {}
    Kind kind() const noexcept { return kind_; }

private:
    Kind kind_;
};

// One request on a fresh connection to host:port. Throws HttpError naming
// "host:port" and the cause (connect, send, timeout, malformed answer),
// Error(kErrShutdown) when `dl.cancel_fd` fires.
HttpResponse http_request(const std::string &host, uint16_t port, const HttpRequest &req,
                          const HttpLimits &limits, uint32_t connect_timeout_ms, const IoDeadline &dl);

struct HttpUrl {
    std::string host;  // without brackets
    uint16_t port = 80;
    std::string target;  // "/path?query", "/" when the URL has none
};
// "http://host[:port][/path][?query]". Throws Error(kErrInvalidArgument) for
// anything else (other schemes, user info, fragments, spaces or control
// characters, a bad port).
HttpUrl parse_http_url(const std::string &url);

// Percent-encodes every byte except A-Z a-z 0-9 - . _ ~ (as curl_easy_escape
// does), uppercase hex.
std::string url_escape(std::string_view s);

// At most `max` bytes of `s` for an error message: printable ASCII kept,
// runs of spaces, tabs and line ends as one space, other bytes as '?',
// trimmed, "..." when cut.
std::string excerpt_for_message(std::string_view s, size_t max = 200);

}  // namespace mcrs
