// The HTTP store: upstream's HTTP metadata server protocol. GET, PUT and
// DELETE on "<url>?key=<escaped key>"; values travel as the bodies, byte
// for byte (no newline added). Calls share nothing but constants, so they
// run concurrently, each within its own deadline.
#include "common/error.h"
#include "metadata/stores.h"

namespace mcrs {

HttpStore::HttpStore(std::string url, const MetadataStoreOptions &opt)
    : url_(std::move(url)), parsed_(parse_http_url(url_)), opt_(opt) {}

std::string HttpStore::target_for(const std::string &key) const {
    const char sep = parsed_.target.find('?') == std::string::npos ? '?' : '&';
    return parsed_.target + sep + "key=" + url_escape(key);
}

HttpResponse HttpStore::request(const char *method, const std::string &key, const std::string *body) {
    HttpRequest req;
    req.method = method;
    req.target = target_for(key);
    if (body) {
        req.send_body = true;
        req.body = *body;
        req.content_type = "application/json";
    }
    HttpLimits lim;
    lim.max_body_bytes = opt_.max_value_bytes;
    IoDeadline dl;
    dl.deadline = MdClock::now() + std::chrono::milliseconds(opt_.timeout_ms);
    try {
        return http_request(parsed_.host, parsed_.port, req, lim, opt_.connect_timeout_ms, dl);
    } catch (const Error &e) {
        throw Error(e.code(), "HTTP metadata server " + url_ + ": " + method + " '" + excerpt_for_message(key, 200) +
                                  "' failed: " + e.what());
    }
}

void HttpStore::fail(const char *op, const std::string &key, const HttpResponse &r) const {
    std::string text = excerpt_for_message(r.body, 200);
    throw Error(kErrMetadata, "HTTP metadata server " + url_ + ": " + op + " '" + excerpt_for_message(key, 200) +
                                  "' answered " + std::to_string(r.status) +
                                  (r.reason.empty() ? "" : " " + excerpt_for_message(r.reason, 60)) +
                                  (text.empty() ? "" : ": " + text));
}

bool HttpStore::get(const std::string &key, std::string &value) {
    HttpResponse r = request("GET", key, nullptr);
    if (r.status == 404) return false;
    if (r.status != 200) fail("GET", key, r);
    value = std::move(r.body);
    return true;
}

void HttpStore::put(const std::string &key, const std::string &value) {
    HttpResponse r = request("PUT", key, &value);
    // Upstream's server answers 400 "Duplicate rpc_meta key not allowed"
    // when an rpc_meta key exists already; fail() shows that text.
    if (r.status != 200) fail("PUT", key, r);
}

bool HttpStore::remove(const std::string &key) {
    HttpResponse r = request("DELETE", key, nullptr);
    if (r.status == 404) return false;
    if (r.status != 200) fail("DELETE", key, r);
    return true;
}

}  // namespace mcrs
