// The Redis store: RESP2 over one TCP connection, as upstream's Redis
// plugin uses it (SET/GET/DEL, AUTH and SELECT from the options).
#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "metadata/stores.h"

namespace mcrs {

// ---- RESP2 reply parser ------------------------------------------------------

namespace {

struct RespCursor {
    std::string_view buf;
    size_t pos = 0;
    const RespLimits &lim;
    const std::string &server;

    [[noreturn]] void fail(const std::string &why) const {
        throw Error(kErrMetadata, "malformed reply from redis " + server + ": " + why);
    }

    // The line at pos (without CRLF); false when its end has not arrived.
    bool line(std::string_view &out) {
        size_t avail = buf.size() - pos;
        size_t look = std::min(avail, lim.max_line_bytes + 2);
        const char *p = buf.data() + pos;
        const void *cr = std::memchr(p, '\r', look);
        const void *lf = std::memchr(p, '\n', look);
        if (lf && (!cr || lf < cr)) fail("line feed without carriage return");
        if (!cr) {
            if (avail >= lim.max_line_bytes + 2)
                fail("line longer than " + std::to_string(lim.max_line_bytes) + " bytes");
            return false;
        }
        size_t len = static_cast<size_t>(static_cast<const char *>(cr) - p);
        if (len > lim.max_line_bytes) fail("line longer than " + std::to_string(lim.max_line_bytes) + " bytes");
        if (len + 1 >= avail) return false;  // the LF is still to come
        if (p[len + 1] != '\n') fail("carriage return without line feed");
        out = std::string_view(p, len);
        pos += len + 2;
        return true;
    }

    int64_t integer(std::string_view s, const char *what) const {
        size_t i = 0;
        bool neg = false;
        if (!s.empty() && s[0] == '-') {
            neg = true;
            i = 1;
        }
        if (i == s.size() || s.size() - i > 19) fail(std::string("bad ") + what + " '" + excerpt_for_message(s, 40) + "'");
        uint64_t v = 0;
        for (; i < s.size(); ++i) {
            if (s[i] < '0' || s[i] > '9') fail(std::string("bad ") + what + " '" + excerpt_for_message(s, 40) + "'");
            v = v * 10 + static_cast<uint64_t>(s[i] - '0');
        }
        if (v > static_cast<uint64_t>(INT64_MAX)) fail(std::string(what) + " out of range");
        return neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
    }

    // One reply at pos; false when incomplete.
    bool reply(RespReply &out, int depth) {
        if (pos >= buf.size()) return false;
        const char type = buf[pos];
        const size_t start = pos;
        ++pos;
        std::string_view l;
        if (!line(l)) {
            pos = start;
            return false;
        }
        switch (type) {
            case '+':
            case '-':
                out.type = type == '+' ? RespReply::Type::Simple : RespReply::Type::Error;
                out.str.assign(l.data(), l.size());
                return true;
            case ':':
                out.type = RespReply::Type::Integer;
                out.integer = integer(l, "integer");
                return true;
            case '$': {
                int64_t n = integer(l, "bulk length");
                if (n == -1) {
                    out.type = RespReply::Type::Nil;
                    return true;
                }
                if (n < 0) fail("negative bulk length " + std::to_string(n));
                if (static_cast<uint64_t>(n) > lim.max_bulk_bytes)
                    fail("bulk string of " + std::to_string(n) + " bytes over the limit of " +
                         std::to_string(lim.max_bulk_bytes));
                size_t len = static_cast<size_t>(n);
                if (buf.size() - pos < len + 2) {
                    pos = start;
                    return false;
                }
                if (buf[pos + len] != '\r' || buf[pos + len + 1] != '\n') fail("bulk string not followed by CRLF");
                out.type = RespReply::Type::Bulk;
                out.str.assign(buf.data() + pos, len);
                pos += len + 2;
                return true;
            }
            case '*': {
                int64_t n = integer(l, "array length");
                if (n == -1) {
                    out.type = RespReply::Type::Nil;
                    return true;
                }
                if (n < 0) fail("negative array length " + std::to_string(n));
                if (static_cast<uint64_t>(n) > lim.max_array_elems)
                    fail("array of " + std::to_string(n) + " elements over the limit of " +
                         std::to_string(lim.max_array_elems));
                if (depth + 1 > lim.max_depth) fail("arrays nested deeper than " + std::to_string(lim.max_depth));
                out.type = RespReply::Type::Array;
                out.elems.clear();
                out.elems.reserve(static_cast<size_t>(n));
                for (int64_t i = 0; i < n; ++i) {
                    out.elems.emplace_back();
                    if (!reply(out.elems.back(), depth + 1)) {
                        pos = start;
                        return false;
                    }
                }
                return true;
            }
            default:
                fail("unknown reply type byte 0x" + std::string(1, "0123456789abcdef"[(uint8_t(type) >> 4) & 15]) +
                     std::string(1, "0123456789abcdef"[uint8_t(type) & 15]));
        }
    }
};

const char *type_name(RespReply::Type t) {
    switch (t) {
        case RespReply::Type::Simple: return "simple string";
        case RespReply::Type::Error: return "error";
        case RespReply::Type::Integer: return "integer";
        case RespReply::Type::Bulk: return "bulk string";
        case RespReply::Type::Nil: return "nil";
        case RespReply::Type::Array: return "array";
    }
    return "?";
}

std::string encode_command(const std::vector<std::string> &args) {
    size_t total = 16;
    for (const auto &a : args) total += a.size() + 24;
    std::string out;
    out.reserve(total);
    out += "*" + std::to_string(args.size()) + "\r\n";
    for (const auto &a : args) {
        out += "$" + std::to_string(a.size()) + "\r\n";
        out += a;
        out += "\r\n";
    }
    return out;
}

// Redis's error reply to `cmd` as an Error, authentication problems said
// as such.
[[noreturn]] void throw_reply_error(const std::string &describe, const std::string &cmd, const std::string &reply) {
    std::string text = excerpt_for_message(reply, 200);
    if (reply.compare(0, 6, "NOAUTH") == 0)
        throw Error(kErrMetadata, describe + ": " + cmd + " refused: authentication required (set the Redis password): " + text);
    if (reply.compare(0, 9, "WRONGPASS") == 0 || cmd == "AUTH")
        throw Error(kErrMetadata, describe + ": authentication failed: " + text);
    throw Error(kErrMetadata, describe + ": " + cmd + " failed: " + text);
}

// A lost connection (as opposed to an answer): the call may be retried on
// a new one.
struct ConnectionLost {
    std::string why;
};

}  // namespace

size_t parse_resp_reply(std::string_view buf, const RespLimits &limits, const std::string &server, RespReply &out) {
    RespCursor c{buf, 0, limits, server};
    RespReply r;
    if (!c.reply(r, 0)) return 0;
    out = std::move(r);
    return c.pos;
}

// ---- RedisStore --------------------------------------------------------------

RedisStore::RedisStore(std::string host, uint16_t port, const MetadataStoreOptions &opt)
    : host_(std::move(host)), port_(port), opt_(opt) {
    if (opt_.redis_db < 0 || opt_.redis_db > 255)
        throw Error(kErrInvalidArgument,
                    "redis database index " + std::to_string(opt_.redis_db) + " out of range (0..255)");
    server_ = join_host_port(host_, port_);
    describe_ = "redis " + server_;
    limits_.max_bulk_bytes = opt_.max_value_bytes;
    // No command the store sends is answered with an array: refusing them
    // keeps one reply (and rbuf_) at one bulk string at most.
    limits_.max_array_elems = 0;
}

RedisStore::~RedisStore() {
    stop_keepalive();
    std::lock_guard<StoreMutex> lk(mu_);
    if (crashed_ || opt_.lease_ttl_s == 0 || held_.empty()) return;
    // As revoking an etcd lease does: the keys go now rather than after
    // the TTL. Only those still holding what this store put (another
    // writer's newer value stays). Best effort, within timeout_ms.
    IoDeadline dl = user_deadline();
    try {
        for (const auto &kv : held_) {
            RespReply r = call({"GET", kv.first}, dl);
            if (r.type == RespReply::Type::Bulk && r.str == kv.second + "\n") call({"DEL", kv.first}, dl);
        }
    } catch (const std::exception &e) {
        MC_LOG(Warn, describe_ << ": deleting the keys at shutdown failed: " << e.what() << " (they expire after "
                               << opt_.lease_ttl_s << " s)");
    }
}

IoDeadline RedisStore::user_deadline() const {
    IoDeadline dl;
    dl.deadline = MdClock::now() + std::chrono::milliseconds(opt_.timeout_ms);
    return dl;
}

RespReply RedisStore::roundtrip(const std::vector<std::string> &args, const IoDeadline &dl) {
    std::string msg = encode_command(args);
    IoOutcome s = send_all_until(conn_.get(), msg, dl);
    if (s.end == IoEnd::Cancelled) throw Error(kErrShutdown, describe_ + ": cancelled (shutting down)");
    if (s.end == IoEnd::Timeout) {
        conn_.reset();
        throw Error(kErrMetadata, describe_ + ": " + args[0] + " timed out after " + std::to_string(opt_.timeout_ms) +
                                      " ms (sending)");
    }
    if (s.end != IoEnd::Ok) throw ConnectionLost{"sending " + args[0] + ": " + s.describe()};
    for (;;) {
        RespReply r;
        size_t used = 0;
        try {
            used = parse_resp_reply(rbuf_, limits_, server_, r);
        } catch (const Error &) {
            // The stream cannot be trusted any more.
            conn_.reset();
            rbuf_.clear();
            throw;
        }
        if (used > 0) {
            rbuf_.erase(0, used);
            return r;
        }
        if (rbuf_.size() > limits_.max_bulk_bytes + 64 * 1024) {
            conn_.reset();
            rbuf_.clear();
            throw Error(kErrMetadata, describe_ + ": reply to " + args[0] + " is larger than the " +
                                          std::to_string(limits_.max_bulk_bytes) + "-byte limit");
        }
        IoOutcome g = recv_some_until(conn_.get(), rbuf_, 64 * 1024, dl);
        if (g.end == IoEnd::Ok) continue;
        if (g.end == IoEnd::Cancelled) {
            conn_.reset();
            rbuf_.clear();
            throw Error(kErrShutdown, describe_ + ": cancelled (shutting down)");
        }
        if (g.end == IoEnd::Timeout) {
            // A late answer would be taken for the next command's: drop
            // the connection.
            conn_.reset();
            rbuf_.clear();
            throw Error(kErrMetadata, describe_ + ": no answer to " + args[0] + " within " +
                                          std::to_string(opt_.timeout_ms) + " ms");
        }
        throw ConnectionLost{"reading the answer to " + args[0] + ": " + g.describe()};
    }
}

void RedisStore::connect_locked(const IoDeadline &dl) {
    conn_.reset();
    rbuf_.clear();
    std::string why;
    Fd fd = connect_until(host_, port_, opt_.connect_timeout_ms, dl, why);
    if (!fd.valid()) throw Error(kErrMetadata, describe_ + ": cannot connect: " + why);
    conn_ = std::move(fd);
    try {
        if (!opt_.redis_password.empty()) {
            std::vector<std::string> auth{"AUTH"};
            if (!opt_.redis_username.empty()) auth.push_back(opt_.redis_username);
            auth.push_back(opt_.redis_password);
            RespReply r = roundtrip(auth, dl);
            if (r.type == RespReply::Type::Error) throw_reply_error(describe_, "AUTH", r.str);
            if (r.type != RespReply::Type::Simple)
                throw Error(kErrMetadata, describe_ + ": authentication failed: unexpected " +
                                              type_name(r.type) + " reply to AUTH");
        }
        if (opt_.redis_db != 0) {
            RespReply r = roundtrip({"SELECT", std::to_string(opt_.redis_db)}, dl);
            if (r.type == RespReply::Type::Error)
                throw_reply_error(describe_, "SELECT " + std::to_string(opt_.redis_db), r.str);
            if (r.type != RespReply::Type::Simple)
                throw Error(kErrMetadata, describe_ + ": unexpected " + std::string(type_name(r.type)) +
                                              " reply to SELECT");
        }
    } catch (const ConnectionLost &e) {
        conn_.reset();
        throw Error(kErrMetadata, describe_ + ": connection lost while setting it up: " + e.why);
    } catch (...) {
        conn_.reset();
        throw;
    }
}

RespReply RedisStore::call(const std::vector<std::string> &args, const IoDeadline &dl) {
    for (int attempt = 0;; ++attempt) {
        bool fresh = false;
        if (!conn_.valid()) {
            connect_locked(dl);
            fresh = true;
        }
        try {
            RespReply r = roundtrip(args, dl);
            if (r.type == RespReply::Type::Error) throw_reply_error(describe_, args[0], r.str);
            return r;
        } catch (const ConnectionLost &e) {
            conn_.reset();
            rbuf_.clear();
            // One retry on a new connection when the old one had broken
            // (a server restart); a new one failing is the answer.
            if (fresh || attempt > 0 || ms_until(dl.deadline) <= 0)
                throw Error(kErrMetadata, describe_ + ": connection lost: " + e.why);
        }
    }
}

void RedisStore::set_locked(const std::string &key, const std::string &value, const IoDeadline &dl) {
    // Upstream's writer ends every value with a newline.
    std::vector<std::string> args{"SET", key, value + "\n"};
    if (opt_.lease_ttl_s > 0) {
        args.push_back("EX");
        args.push_back(std::to_string(opt_.lease_ttl_s));
    }
    RespReply r = call(args, dl);
    if (r.type != RespReply::Type::Simple)
        throw Error(kErrMetadata, describe_ + ": unexpected " + std::string(type_name(r.type)) + " reply to SET");
}

bool RedisStore::get(const std::string &key, std::string &value) {
    const IoDeadline dl = user_deadline();
    auto lk = lock_before(mu_, dl, describe_);
    RespReply r = call({"GET", key}, dl);
    if (r.type == RespReply::Type::Nil) return false;
    if (r.type != RespReply::Type::Bulk)
        throw Error(kErrMetadata, describe_ + ": unexpected " + std::string(type_name(r.type)) + " reply to GET");
    value = std::move(r.str);
    return true;
}

void RedisStore::put(const std::string &key, const std::string &value) {
    const IoDeadline dl = user_deadline();
    auto lk = lock_before(mu_, dl, describe_);
    set_locked(key, value, dl);
    if (opt_.lease_ttl_s > 0) {
        held_[key] = value;
        if (!keepalive_.joinable() && !crashed_) keepalive_ = std::thread([this] { keepalive_loop(); });
    }
}

bool RedisStore::remove(const std::string &key) {
    const IoDeadline dl = user_deadline();
    auto lk = lock_before(mu_, dl, describe_);
    held_.erase(key);  // first: a DEL that lands but times out must not be put back by a refresh
    RespReply r = call({"DEL", key}, dl);
    if (r.type != RespReply::Type::Integer)
        throw Error(kErrMetadata, describe_ + ": unexpected " + std::string(type_name(r.type)) + " reply to DEL");
    return r.integer > 0;
}

void RedisStore::refresh_locked(const IoDeadline &dl) {
    const std::string ttl = std::to_string(opt_.lease_ttl_s);
    for (const auto &kv : held_) {
        if (stop_.load()) return;
        RespReply r = call({"EXPIRE", kv.first, ttl}, dl);
        if (r.type != RespReply::Type::Integer)
            throw Error(kErrMetadata, describe_ + ": unexpected " + std::string(type_name(r.type)) + " reply to EXPIRE");
        if (r.integer == 0) {
            // Expired meanwhile (the server was unreachable longer than the
            // TTL, or restarted empty): write it again.
            MC_LOG(Info, describe_ << ": key '" << excerpt_for_message(kv.first, 200) << "' had expired; set again");
            set_locked(kv.first, kv.second, dl);
        }
    }
}

void RedisStore::keepalive_loop() {
    // Nothing may escape a thread: anything but the store's own errors
    // (an allocation failure) ends the keep-alive with a log line, and the
    // keys then expire as a crashed engine's would.
    try {
        keepalive_body();
    } catch (const std::exception &e) {
        MC_LOG(Error, describe_ << ": lease keep-alive stopped: " << e.what());
    } catch (...) {
        MC_LOG(Error, describe_ << ": lease keep-alive stopped by an unknown exception");
    }
}

void RedisStore::keepalive_body() {
    const auto interval = std::chrono::milliseconds(std::max<uint32_t>(opt_.lease_ttl_s * 1000 / 3, 100));
    const auto budget =
        std::chrono::milliseconds(std::min<uint32_t>(opt_.timeout_ms, std::max<uint32_t>(opt_.lease_ttl_s * 1000 / 2, 500)));
    bool failing = false;
    std::unique_lock<StoreMutex> lk(mu_);
    for (;;) {
        // The mutex is released while waiting.
        if (cv_.wait_for(lk, interval, [this] { return stop_.load(); })) return;
        if (held_.empty()) continue;
        try {
            refresh_locked(IoDeadline{MdClock::now() + budget, wake_.read_fd()});
            if (failing) MC_LOG(Info, describe_ << ": key refresh works again");
            failing = false;
        } catch (const Error &e) {
            if (e.code() == kErrShutdown || stop_.load()) return;
            if (!failing) MC_LOG(Warn, describe_ << ": refreshing the keys' expiry failed: " << e.what());
            failing = true;
        }
    }
}

void RedisStore::stop_keepalive() {
    stop_.store(true);
    wake_.wake();
    { std::lock_guard<StoreMutex> lk(mu_); }
    cv_.notify_all();
    if (keepalive_.joinable()) keepalive_.join();
}

void RedisStore::simulate_crash_for_test() {
    stop_keepalive();
    std::lock_guard<StoreMutex> lk(mu_);
    crashed_ = true;
    conn_.reset();
    rbuf_.clear();
}

}  // namespace mcrs
