#include "common/text.h"

#include <cstdio>
#include <strings.h>
#include <unordered_set>

namespace mcrs {

std::string hex(uint64_t v) {
    char buf[2 + 16 + 1];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
    return buf;
}

std::string trim(const std::string &s) {
    auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
    size_t b = 0, e = s.size();
    while (b < e && space(s[b])) ++b;
    while (e > b && space(s[e - 1])) --e;
    return s.substr(b, e - b);
}

std::optional<bool> parse_bool(const std::string &raw) {
    std::string v = trim(raw);
    for (const char *t : {"1", "true", "yes", "on", "enable"})
        if (strcasecmp(v.c_str(), t) == 0) return true;
    for (const char *f : {"0", "false", "no", "off", "disable"})
        if (strcasecmp(v.c_str(), f) == 0) return false;
    return std::nullopt;
}

std::vector<std::string> split_list(const std::string &s) {
    std::vector<std::string> out;
    std::unordered_set<std::string> seen;
    size_t start = 0;
    while (start <= s.size()) {
        size_t end = s.find_first_of(",;", start);
        if (end == std::string::npos) end = s.size();
        std::string item = trim(s.substr(start, end - start));
        if (!item.empty() && seen.insert(item).second) out.push_back(std::move(item));
        start = end + 1;
    }
    return out;
}

std::string join_list(const std::vector<std::string> &v) {
    std::string out;
    for (const auto &s : v) {
        if (!out.empty()) out.push_back(',');
        out += s;
    }
    return out;
}

}  // namespace mcrs
