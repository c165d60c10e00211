// The etcd store: etcd's v3 JSON gateway (grpc-gateway) over plain HTTP.
// Keys and values travel base64-encoded; 64-bit integers come back as JSON
// strings ("deleted":"1", "ID":"7587..."), and fields equal to zero or
// empty are left out ("kvs" when nothing matched, "value" when empty, "TTL"
// when a lease is gone).
#include <poll.h>

#include <algorithm>

#include "common/error.h"
#include "common/log.h"
#include "metadata/base64.h"
#include "metadata/stores.h"

namespace mcrs {

namespace {

constexpr uint64_t kJsonSlack = 64 * 1024;  // headers, revisions, field names

uint64_t base64_len(uint64_t n) { return (n + 2) / 3 * 4; }

// An int64 field that the gateway writes as a string (or a number); 0 when
// absent. False when present but not an integer.
bool int_field(const Json &obj, const char *name, int64_t &out) {
    out = 0;
    const Json *f = obj.find(name);
    if (!f || f->is_null()) return true;
    if (f->get_i64(out)) return true;
    const std::string *s = f->get_string();
    if (!s || s->empty() || s->size() > 20) return false;
    size_t i = 0;
    bool neg = false;
    if ((*s)[0] == '-') {
        neg = true;
        i = 1;
        if (s->size() == 1) return false;
    }
    uint64_t v = 0;
    for (; i < s->size(); ++i) {
        char c = (*s)[i];
        if (c < '0' || c > '9') return false;
        if (v > (uint64_t(INT64_MAX) + 1 - uint64_t(c - '0')) / 10) return false;
        v = v * 10 + uint64_t(c - '0');
    }
    if (!neg && v > uint64_t(INT64_MAX)) return false;
    out = neg ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
    return true;
}

// The end (one past) of the first complete JSON object in `s` (leading
// whitespace allowed), or npos. A streamed gateway answer is a sequence of
// objects; the first one is all we need.
size_t first_object_end(const std::string &s) {
    size_t i = 0;
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
    // Not an object (a proxy's text, say): read it all (bounded by the body
    // limit) so that the message can show it.
    if (i == s.size() || s[i] != '{') return std::string::npos;
    int depth = 0;
    bool in_str = false, esc = false;
    for (; i < s.size(); ++i) {
        char c = s[i];
        if (in_str) {
            if (esc) esc = false;
            else if (c == '\\') esc = true;
            else if (c == '"') in_str = false;
            continue;
        }
        if (c == '"') in_str = true;
        else if (c == '{' || c == '[') ++depth;
        else if (c == '}' || c == ']') {
            if (--depth == 0) return i + 1;
        }
    }
    return std::string::npos;
}

// The gateway's error reply: {"error":"..","message":"..","code":N} for
// unary calls, {"error":{"grpc_code":N,"message":".."}} inside streams.
void read_error(const Json &j, int &code, std::string &msg) {
    int64_t c = 0;
    const Json *e = j.find("error");
    if (e && e->is_object()) {
        if (int_field(*e, "grpc_code", c)) code = static_cast<int>(c);
        msg = json_string_or(*e, "message", "");
        return;
    }
    if (int_field(j, "code", c)) code = static_cast<int>(c);
    msg = json_string_or(j, "message", "");
    if (msg.empty()) msg = json_string_or(j, "error", "");
}

// gRPC codes that mean "this member cannot serve now, ask again or ask
// another": DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNAVAILABLE.
bool retryable(int http_status, int grpc_code) {
    if (grpc_code == 4 || grpc_code == 8 || grpc_code == 14) return true;
    return grpc_code == 0 && http_status >= 500;
}

bool lease_not_found(const EtcdStore::Answer &a) {
    return a.grpc_code == 5 || a.message.find("lease not found") != std::string::npos;
}

std::string endpoints_text(const std::vector<HostPort> &eps) {
    std::string s;
    for (const auto &e : eps) {
        if (!s.empty()) s += ',';
        s += join_host_port(e.host, e.port);
    }
    return s;
}

// Sleeps up to `ms`, or less when the cancel fd fires.
void pause_ms(int ms, int cancel_fd) {
    if (ms <= 0) return;
    struct pollfd p {cancel_fd, POLLIN, 0};
    ::poll(&p, cancel_fd >= 0 ? 1 : 0, ms);
}

}  // namespace

EtcdStore::EtcdStore(std::vector<HostPort> endpoints, const MetadataStoreOptions &opt)
    : endpoints_(std::move(endpoints)), opt_(opt) {
    if (endpoints_.empty()) throw Error(kErrInvalidArgument, "etcd: no endpoint given");
    describe_ = "etcd " + endpoints_text(endpoints_);
}

EtcdStore::~EtcdStore() {
    stop_keepalive();
    std::lock_guard<StoreMutex> lk(mu_);
    if (crashed_ || lease_id_ == 0) return;
    // Revoking deletes every key attached to the lease at once. Best
    // effort: when it fails the keys still expire after the TTL.
    try {
        Json body = Json::object();
        body.set("ID", Json(lease_id_));
        Answer a = call("/v3/lease/revoke", body, user_deadline(), 0);
        if (a.http_status != 200 && !lease_not_found(a))
            MC_LOG(Warn, describe_ << ": revoking lease " << lease_id_ << " failed: " << a.message
                                   << " (its keys expire after " << opt_.lease_ttl_s << " s)");
    } catch (const std::exception &e) {
        MC_LOG(Warn, describe_ << ": revoking lease " << lease_id_ << " failed: " << e.what() << " (its keys expire after "
                               << opt_.lease_ttl_s << " s)");
    }
}

IoDeadline EtcdStore::user_deadline() const {
    IoDeadline dl;
    dl.deadline = MdClock::now() + std::chrono::milliseconds(opt_.timeout_ms);
    return dl;
}

EtcdStore::Answer EtcdStore::call(const char *path, const Json &body, const IoDeadline &dl,
                                  uint64_t extra_body_bytes, bool first_object) {
    HttpRequest req;
    req.method = "POST";
    req.target = path;
    req.send_body = true;
    req.body = body.dump();
    req.content_type = "application/json";
    if (first_object)
        req.body_complete = [](const std::string &b) { return first_object_end(b) != std::string::npos; };
    HttpLimits lim;
    lim.max_body_bytes = base64_len(opt_.max_value_bytes + 1) + extra_body_bytes + kJsonSlack;

    const size_t n = endpoints_.size();
    const int per_attempt =
        n == 1 ? INT32_MAX : std::max<int>(static_cast<int>(opt_.timeout_ms / (n + 1)), 250);
    std::vector<std::string> last_error(n);
    for (int pass = 0;; ++pass) {
        bool again = false;
        const size_t start = last_good_.load() % n;
        for (size_t i = 0; i < n; ++i) {
            const size_t idx = (start + i) % n;
            const HostPort &ep = endpoints_[idx];
            int left = ms_until(dl.deadline);
            if (left <= 0) break;
            // With several members, each attempt gets a part of the time,
            // so that one that accepts and never answers (or waits for a
            // leader that is gone) leaves time for the others and for
            // another round.
            int budget = std::min(left, per_attempt);
            IoDeadline adl{std::min(dl.deadline, MdClock::now() + std::chrono::milliseconds(budget)), dl.cancel_fd};
            Answer a;
            try {
                HttpResponse r = http_request(ep.host, ep.port, req, lim, opt_.connect_timeout_ms, adl);
                a.http_status = r.status;
                std::string_view text = r.body;
                if (first_object) {
                    size_t end = first_object_end(r.body);
                    if (end != std::string::npos) text = text.substr(0, end);
                }
                bool parsed = false;
                try {
                    a.json = Json::parse(text);
                    parsed = a.json.is_object();
                } catch (const Error &) {
                }
                if (r.status == 200) {
                    if (!parsed) {
                        last_error[idx] = "answer is not a JSON object: '" + excerpt_for_message(r.body, 120) + "'";
                        continue;
                    }
                    // A stream's error arrives inside a 200 answer.
                    if (const Json *e = a.json.find("error")) {
                        read_error(a.json, a.grpc_code, a.message);
                        if (a.message.empty()) a.message = excerpt_for_message(e->dump(), 200);
                        a.http_status = a.grpc_code == 5 ? 404 : 500;
                        if (retryable(a.http_status, a.grpc_code)) {
                            last_error[idx] = a.message;
                            again = true;
                            continue;
                        }
                    }
                    last_good_.store(idx);
                    return a;
                }
                if (parsed) read_error(a.json, a.grpc_code, a.message);
                if (a.message.empty())
                    a.message = "HTTP " + std::to_string(r.status) + " " + excerpt_for_message(r.reason, 60) + ": '" +
                                excerpt_for_message(r.body, 200) + "'";
                if (retryable(r.status, a.grpc_code)) {
                    last_error[idx] = a.message;
                    again = true;
                    continue;
                }
                // A definite answer (no such lease, bad request, ...).
                last_good_.store(idx);
                return a;
            } catch (const HttpError &e) {
                // No answer in time or a cut connection may pass; nobody
                // listening or a bad answer will not.
                if (e.kind() == HttpError::Kind::Timeout || e.kind() == HttpError::Kind::Io) again = true;
                last_error[idx] = e.what();
            }
        }
        int left = ms_until(dl.deadline);
        if (!again || left <= 0) break;
        // Some member answered "not now" (no leader, an election going on)
        // or not at all: ask again shortly, within the deadline.
        pause_ms(std::min(left, 100 + 100 * std::min(pass, 4)), dl.cancel_fd);
        if (dl.cancel_fd >= 0 && stop_.load()) throw Error(kErrShutdown, describe_ + ": shutting down");
    }
    std::string why;
    for (size_t i = 0; i < n; ++i) {
        if (last_error[i].empty()) continue;
        if (!why.empty()) why += "; ";
        // http_request's messages already name the endpoint.
        why += last_error[i].find(join_host_port(endpoints_[i].host, endpoints_[i].port)) != std::string::npos
                   ? last_error[i]
                   : join_host_port(endpoints_[i].host, endpoints_[i].port) + ": " + last_error[i];
    }
    if (why.empty()) why = "no time left";
    throw Error(kErrMetadata, describe_ + ": " + path + ": no endpoint answered (timeout " +
                                  std::to_string(opt_.timeout_ms) + " ms): " + why);
}

void EtcdStore::fail(const std::string &op, const std::string &key, const Answer &a) const {
    throw Error(kErrMetadata, describe_ + ": " + op + " '" + excerpt_for_message(key, 200) + "' failed: " +
                                  (a.message.empty() ? "HTTP " + std::to_string(a.http_status) : a.message) +
                                  (a.grpc_code ? " (gRPC code " + std::to_string(a.grpc_code) + ")" : ""));
}

bool EtcdStore::get(const std::string &key, std::string &value) {
    const IoDeadline dl = user_deadline();
    auto lk = lock_before(mu_, dl, describe_);
    Json body = Json::object();
    body.set("key", Json(base64_encode(key)));
    Answer a = call("/v3/kv/range", body, dl, base64_len(key.size()));
    if (a.http_status != 200) fail("get", key, a);
    const Json *kvs = a.json.find("kvs");
    if (!kvs || kvs->is_null()) return false;
    const Json::Array *arr = kvs->get_array();
    if (!arr) throw Error(kErrMetadata, describe_ + ": get '" + key + "': malformed answer ('kvs' is not an array)");
    if (arr->empty()) return false;
    const Json &kv = (*arr)[0];
    if (!kv.is_object()) throw Error(kErrMetadata, describe_ + ": get '" + key + "': malformed answer (kvs[0])");
    const Json *v = kv.find("value");
    std::string out;
    if (v && !v->is_null()) {
        const std::string *s = v->get_string();
        if (!s || !base64_decode(*s, out))
            throw Error(kErrMetadata, describe_ + ": get '" + key + "': the value is not valid base64");
    }
    if (out.size() > opt_.max_value_bytes)
        throw Error(kErrMetadata, describe_ + ": get '" + key + "': value of " + std::to_string(out.size()) +
                                      " bytes over the limit of " + std::to_string(opt_.max_value_bytes));
    value = std::move(out);
    return true;
}

EtcdStore::Answer EtcdStore::put_once(const std::string &key, const std::string &value, const IoDeadline &dl) {
    Json body = Json::object();
    body.set("key", Json(base64_encode(key)));
    // Upstream's writers end every value with a newline.
    body.set("value", Json(base64_encode(value + "\n")));
    if (opt_.lease_ttl_s > 0) body.set("lease", Json(lease_id_));
    return call("/v3/kv/put", body, dl, base64_len(key.size()));
}

void EtcdStore::put_locked(const std::string &key, const std::string &value, const IoDeadline &dl) {
    if (opt_.lease_ttl_s > 0 && lease_id_ == 0) grant_locked(dl);
    Answer a = put_once(key, value, dl);
    if (a.http_status != 200 && opt_.lease_ttl_s > 0 && lease_not_found(a)) {
        // The lease expired (etcd unreachable for longer than the TTL):
        // a new one, and every key put again under it.
        MC_LOG(Warn, describe_ << ": lease " << lease_id_ << " is gone; granting a new one");
        held_[key] = value;
        regrant_locked(dl);
        return;
    }
    if (a.http_status != 200) fail("put", key, a);
    if (opt_.lease_ttl_s > 0) held_[key] = value;
}

void EtcdStore::put(const std::string &key, const std::string &value) {
    const IoDeadline dl = user_deadline();
    auto lk = lock_before(mu_, dl, describe_);
    put_locked(key, value, dl);
}

bool EtcdStore::remove(const std::string &key) {
    const IoDeadline dl = user_deadline();
    auto lk = lock_before(mu_, dl, describe_);
    Json body = Json::object();
    body.set("key", Json(base64_encode(key)));
    held_.erase(key);  // first: a DELETE that lands but times out must not be put back by a lease renewal
    Answer a = call("/v3/kv/deleterange", body, dl, 0);
    if (a.http_status != 200) fail("remove", key, a);
    int64_t deleted = 0;
    if (!int_field(a.json, "deleted", deleted))
        throw Error(kErrMetadata, describe_ + ": remove '" + key + "': malformed answer ('deleted')");
    return deleted > 0;
}

void EtcdStore::grant_locked(const IoDeadline &dl) {
    Json body = Json::object();
    body.set("TTL", Json(static_cast<int64_t>(opt_.lease_ttl_s)));
    Answer a = call("/v3/lease/grant", body, dl, 0);
    int64_t id = 0;
    std::string err = a.http_status == 200 ? json_string_or(a.json, "error", "") : a.message;
    if (a.http_status != 200 || !err.empty() || !int_field(a.json, "ID", id) || id == 0)
        throw Error(kErrMetadata, describe_ + ": granting a lease of " + std::to_string(opt_.lease_ttl_s) +
                                      " s failed: " + (err.empty() ? "no lease ID in the answer" : err));
    lease_id_ = id;
    start_keepalive_locked();
}

void EtcdStore::regrant_locked(const IoDeadline &dl) {
    // Until every key is put again, the keep-alive thread keeps trying.
    need_regrant_ = true;
    lease_id_ = 0;
    grant_locked(dl);
    for (const auto &kv : held_) {
        Answer a = put_once(kv.first, kv.second, dl);
        if (a.http_status != 200) fail("put (under a new lease)", kv.first, a);
    }
    need_regrant_ = false;
    MC_LOG(Info, describe_ << ": lease " << lease_id_ << " granted; " << held_.size() << " key(s) put again");
}

void EtcdStore::start_keepalive_locked() {
    if (keepalive_.joinable() || crashed_) return;
    keepalive_ = std::thread([this] { keepalive_loop(); });
}

void EtcdStore::keepalive_loop() {
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

void EtcdStore::keepalive_body() {
    const auto interval = std::chrono::milliseconds(std::max<uint32_t>(opt_.lease_ttl_s * 1000 / 3, 100));
    const auto call_budget =
        std::chrono::milliseconds(std::min<uint32_t>(opt_.timeout_ms, std::max<uint32_t>(opt_.lease_ttl_s * 1000 / 2, 500)));
    bool failing = false;
    std::unique_lock<StoreMutex> lk(mu_);
    for (;;) {
        // The mutex is released while waiting.
        if (cv_.wait_for(lk, interval, [this] { return stop_.load(); })) return;
        if (need_regrant_) {
            // A renewal that failed half-way (etcd unreachable): again.
            try {
                regrant_locked(IoDeadline{MdClock::now() + std::chrono::milliseconds(opt_.timeout_ms),
                                          wake_.read_fd()});
                MC_LOG(Info, describe_ << ": lease renewed");
                failing = false;
            } catch (const Error &e) {
                if (e.code() == kErrShutdown || stop_.load()) return;
                if (!failing) MC_LOG(Warn, describe_ << ": renewing the lease failed: " << e.what());
                failing = true;
            }
            continue;
        }
        const int64_t id = lease_id_;
        if (id == 0) continue;
        lk.unlock();
        IoDeadline dl{MdClock::now() + call_budget, wake_.read_fd()};
        bool gone = false;
        std::string problem;
        try {
            Json body = Json::object();
            body.set("ID", Json(id));
            Answer a = call("/v3/lease/keepalive", body, dl, 0, true);
            int64_t ttl = 0;
            const Json *res = a.json.find("result");
            if (a.http_status == 200 && res && res->is_object()) {
                if (!int_field(*res, "TTL", ttl)) problem = "malformed keep-alive answer";
                else if (ttl <= 0) gone = true;
            } else if (lease_not_found(a)) {
                gone = true;
            } else {
                problem = a.message.empty() ? "unexpected keep-alive answer" : a.message;
            }
        } catch (const Error &e) {
            if (e.code() == kErrShutdown || stop_.load()) {
                lk.lock();
                return;
            }
            problem = e.what();
        }
        lk.lock();
        if (stop_.load()) return;
        if (!problem.empty()) {
            if (!failing) MC_LOG(Warn, describe_ << ": keeping lease " << id << " alive failed: " << problem);
            failing = true;
            continue;
        }
        if (failing) MC_LOG(Info, describe_ << ": lease keep-alive works again");
        failing = false;
        if (gone && lease_id_ == id) {
            MC_LOG(Warn, describe_ << ": lease " << id << " expired; granting a new one and putting "
                                   << held_.size() << " key(s) again");
            try {
                regrant_locked(IoDeadline{MdClock::now() + std::chrono::milliseconds(opt_.timeout_ms),
                                          wake_.read_fd()});
            } catch (const Error &e) {
                if (e.code() == kErrShutdown || stop_.load()) return;
                MC_LOG(Warn, describe_ << ": renewing the lease failed: " << e.what());
                failing = true;
            }
        }
    }
}

void EtcdStore::stop_keepalive() {
    stop_.store(true);
    wake_.wake();
    { std::lock_guard<StoreMutex> lk(mu_); }
    cv_.notify_all();
    if (keepalive_.joinable()) keepalive_.join();
}

void EtcdStore::simulate_crash_for_test() {
    stop_keepalive();
    std::lock_guard<StoreMutex> lk(mu_);
    crashed_ = true;
}

int64_t EtcdStore::lease_id_for_test() {
    std::lock_guard<StoreMutex> lk(mu_);
    return lease_id_;
}

}  // namespace mcrs
