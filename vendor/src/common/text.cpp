#include "common/text.h"

#include <cstdio>

namespace mcrs {

std::string hex(uint64_t v) {
    char buf[2 + 16 + 1];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
    return buf;
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
