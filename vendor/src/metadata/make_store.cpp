// make_metadata_store: picks the store a connection string names, with
// upstream's rules (metadata_store.h). Nothing is contacted here.
#include <cctype>

#include "common/error.h"
#include "common/text.h"
#include "metadata/http_client.h"
#include "metadata/stores.h"

namespace mcrs {

namespace {

constexpr uint16_t kEtcdDefaultPort = 2379;
constexpr uint16_t kRedisDefaultPort = 12001;  // upstream's default

std::string lower(std::string s) {
    for (char &c : s)
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    return s;
}

bool starts_with_ci(const std::string &s, const char *prefix) {
    std::string p(prefix);
    return s.size() >= p.size() && lower(s.substr(0, p.size())) == p;
}

// RFC 3986: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ).
bool is_scheme(const std::string &s) {
    if (s.empty() || !std::isalpha(static_cast<unsigned char>(s[0]))) return false;
    for (char c : s)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.') return false;
    return true;
}

// "host[:port]" (IPv6 in brackets), strictly: a port that is there must
// parse. `what` names the setting in messages.
HostPort parse_authority(const std::string &text, uint16_t default_port, const std::string &what) {
    std::string s = text;
    while (!s.empty() && s.back() == '/') s.pop_back();
    if (s.empty()) throw Error(kErrInvalidArgument, what + ": empty address");
    // parse_http_url checks host and port strictly; its default port is 80.
    HttpUrl u = parse_http_url("http://" + s);
    if (u.target != "/")
        throw Error(kErrInvalidArgument, what + ": '" + text + "' has a path; expected host[:port]");
    HostPort hp;
    hp.host = u.host;
    const bool has_port = s[0] == '[' ? s.back() != ']' : s.find(':') != std::string::npos;
    hp.port = has_port ? u.port : default_port;
    return hp;
}

std::unique_ptr<MetadataStore> make_etcd(const std::string &conn, const std::string &list,
                                         const MetadataStoreOptions &opt) {
    std::vector<HostPort> eps;
    for (std::string item : split_list(list)) {
        if (starts_with_ci(item, "https://"))
            throw Error(kErrNotImplemented,
                        "etcd endpoint '" + item +
                            "': TLS is not built into the engine; put a TLS-terminating proxy in front of etcd "
                            "or use plain http:// on a trusted network");
        if (starts_with_ci(item, "http://")) item = item.substr(7);
        if (item.find("://") != std::string::npos)
            throw Error(kErrInvalidArgument, "etcd endpoint '" + item + "' in '" + conn +
                                                 "': unknown scheme (expected host:port or http://host:port)");
        eps.push_back(parse_authority(item, kEtcdDefaultPort, "etcd endpoint in '" + conn + "'"));
    }
    if (eps.empty()) throw Error(kErrInvalidArgument, "metadata connection string '" + conn + "' names no etcd endpoint");
    return std::make_unique<EtcdStore>(std::move(eps), opt);
}

}  // namespace

std::unique_ptr<MetadataStore> make_metadata_store(const std::string &conn_raw, const MetadataStoreOptions &opt) {
    const std::string conn = trim(conn_raw);
    if (conn.empty()) throw Error(kErrInvalidArgument, "empty metadata connection string");
    if (opt.timeout_ms == 0) throw Error(kErrInvalidArgument, "metadata timeout_ms must be > 0");
    if (opt.connect_timeout_ms == 0) throw Error(kErrInvalidArgument, "metadata connect_timeout_ms must be > 0");
    if (opt.max_value_bytes == 0) throw Error(kErrInvalidArgument, "metadata max_value_bytes must be > 0");
    const size_t sep = conn.find("://");
    // No scheme, or none before the first endpoint ("h1:p1,http://h2:p2"):
    // an etcd endpoint list.
    if (sep == std::string::npos || !is_scheme(conn.substr(0, sep))) return make_etcd(conn, conn, opt);
    const std::string scheme = lower(conn.substr(0, sep));
    const std::string rest = conn.substr(sep + 3);
    if (scheme == "etcd") return make_etcd(conn, rest, opt);
    // "http://h1:p1,http://h2:p2": no HTTP URL has ',' or ';' in its host
    // part, so this is a list of etcd endpoints written with http://.
    if (scheme == "http" && rest.substr(0, rest.find_first_of("/?")).find_first_of(",;") != std::string::npos)
        return make_etcd(conn, conn, opt);
    if (scheme == "redis") {
        HostPort hp = parse_authority(rest, kRedisDefaultPort, "redis address in '" + conn + "'");
        return std::make_unique<RedisStore>(hp.host, hp.port, opt);
    }
    if (scheme == "http") return std::make_unique<HttpStore>(conn, opt);
    if (scheme == "https")
        throw Error(kErrNotImplemented, "metadata server '" + conn +
                                            "': TLS (https://) is not built into the engine; put a TLS-terminating "
                                            "proxy in front of the server, or use plain http:// on a trusted network");
    throw Error(kErrInvalidArgument, "unknown metadata scheme '" + excerpt_for_message(conn.substr(0, sep), 40) +
                                         "://' in '" + excerpt_for_message(conn, 200) +
                                         "' (expected etcd://, redis:// or http://)");
}

}  // namespace mcrs
