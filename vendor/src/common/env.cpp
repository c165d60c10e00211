#include "common/env.h"

#include <cerrno>
#include <cstdlib>
#include <strings.h>

#include "common/log.h"

namespace mcrs {

std::string trim(const std::string &s) {
    size_t b = 0, e = s.size();
    while (b < e && (s[b] == ' ' || s[b] == '\t' || s[b] == '\n' || s[b] == '\r')) ++b;
    while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\n' || s[e - 1] == '\r')) --e;
    return s.substr(b, e - b);
}

std::optional<std::string> env_string(const char *name) {
    const char *v = std::getenv(name);
    if (!v) return std::nullopt;
    return std::string(v);
}

bool env_present(const char *name) { return std::getenv(name) != nullptr; }

std::optional<bool> parse_bool(const std::string &raw) {
    std::string v = trim(raw);
    const char *t[] = {"1", "true", "yes", "on", "enable"};
    const char *f[] = {"0", "false", "no", "off", "disable"};
    for (const char *x : t)
        if (strcasecmp(v.c_str(), x) == 0) return true;
    for (const char *x : f)
        if (strcasecmp(v.c_str(), x) == 0) return false;
    return std::nullopt;
}

bool env_bool(const char *name, bool fallback) {
    auto v = env_string(name);
    if (!v) return fallback;
    auto b = parse_bool(*v);
    if (!b) {
        MC_LOG(Warn, name << "=" << *v << " is not a boolean; using the default "
                          << (fallback ? "true" : "false"));
        return fallback;
    }
    return *b;
}

int64_t env_int(const char *name, int64_t fallback, int64_t lo, int64_t hi) {
    auto v = env_string(name);
    if (!v) return fallback;
    std::string s = trim(*v);
    errno = 0;
    char *end = nullptr;
    long long x = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || errno != 0 || end == nullptr || *end != '\0') {
        MC_LOG(Warn, name << "=" << *v << " is not an integer; using " << fallback);
        return fallback;
    }
    if (x < lo || x > hi) {
        MC_LOG(Warn, name << "=" << x << " is outside [" << lo << ", " << hi << "]; using "
                          << fallback);
        return fallback;
    }
    return x;
}

}  // namespace mcrs
