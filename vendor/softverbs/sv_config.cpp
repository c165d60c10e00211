#include "sv_config.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>

namespace sv {

namespace {

std::vector<std::string> split(const std::string &s, char sep) {
    std::vector<std::string> out;
    std::string cur;
    std::istringstream in(s);
    while (std::getline(in, cur, sep)) out.push_back(cur);
    if (!s.empty() && s.back() == sep) out.emplace_back();
    return out;
}

std::string strip(const std::string &s) {
    size_t b = s.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return "";
    size_t e = s.find_last_not_of(" \t\r\n");
    return s.substr(b, e - b + 1);
}

// A decimal integer with an optional k/m/g/t (binary) suffix.
bool parse_u64(const std::string &v, uint64_t &out) {
    if (v.empty() || v[0] == '-') return false;
    char *end = nullptr;
    unsigned long long n = std::strtoull(v.c_str(), &end, 10);
    if (end == v.c_str()) return false;
    std::string suffix(end);
    int shift = 0;
    if (suffix == "k" || suffix == "K") shift = 10;
    else if (suffix == "m" || suffix == "M") shift = 20;
    else if (suffix == "g" || suffix == "G") shift = 30;
    else if (suffix == "t" || suffix == "T") shift = 40;
    else if (!suffix.empty()) return false;
    if (shift && n > (~0ull >> shift)) return false;
    out = n << shift;
    return true;
}

bool parse_int(const std::string &v, int lo, int hi, int &out) {
    char *end = nullptr;
    long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < lo || n > hi) return false;
    out = static_cast<int>(n);
    return true;
}

bool parse_ipv4(const std::string &v, uint32_t &out) {
    unsigned a, b, c, d;
    char tail;
    if (std::sscanf(v.c_str(), "%u.%u.%u.%u%c", &a, &b, &c, &d, &tail) != 4) return false;
    if (a > 255 || b > 255 || c > 255 || d > 255) return false;
    out = (a << 24) | (b << 16) | (c << 8) | d;
    return true;
}

bool valid_name(const std::string &n) {
    if (n.empty() || n.size() > 63) return false;
    for (char ch : n)
        if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-')) return false;
    return true;
}

bool parse_key(DeviceSpec &d, const std::string &key, const std::string &val) {
    uint64_t u = 0;
    if (key == "numa") return parse_int(val, -1, 1023, d.numa);
    if (key == "pci" || key == "bridge") {
        unsigned dom, bus, slot, fn;
        char tail;
        if (std::sscanf(val.c_str(), "%x:%x:%x.%x%c", &dom, &bus, &slot, &fn, &tail) != 4) return false;
        (key == "pci" ? d.pci : d.bridge) = val;
        return true;
    }
    if (key == "gids") return parse_int(val, 1, kGidTableLen, d.gids);
    if (key == "netdev") {
        d.netdev = val;
        return valid_name(val);
    }
    if (key == "ipv4") return parse_ipv4(val, d.ipv4);
    if (key == "mtu") {
        const int sizes[] = {256, 512, 1024, 2048, 4096};
        for (int i = 0; i < 5; ++i)
            if (val == std::to_string(sizes[i])) {
                d.active_mtu = i + 1;
                return true;
            }
        return false;
    }
    if (key == "port") {
        if (val != "up" && val != "down") return false;
        d.port_up = val == "up";
        return true;
    }
    if (key == "max_qp") return parse_int(val, 1, 1 << 24, d.max_qp);
    if (key == "max_cqe") return parse_int(val, 1, 1 << 24, d.max_cqe);
    if (key == "max_qp_wr") return parse_int(val, 1, 1 << 20, d.max_qp_wr);
    if (key == "max_sge") return parse_int(val, 1, 64, d.max_sge);
    if (key == "max_mr_size") {
        if (!parse_u64(val, u) || u == 0) return false;
        d.max_mr_size = u;
        return true;
    }
    return false;
}

}  // namespace

bool parse_spec(const std::string &spec, std::vector<DeviceSpec> &out, std::string &err) {
    out.clear();
    std::set<std::string> names;
    if (strip(spec).empty()) return true;
    for (const std::string &raw : split(spec, ',')) {
        std::vector<std::string> parts = split(strip(raw), ':');
        if (parts.size() < 2) {
            err = "device '" + raw + "' needs name:ib|roce";
            return false;
        }
        DeviceSpec d;
        d.name = strip(parts[0]);
        if (!valid_name(d.name) || !names.insert(d.name).second) {
            err = "bad or duplicate device name '" + d.name + "'";
            return false;
        }
        std::string ll = strip(parts[1]);
        if (ll != "ib" && ll != "roce") {
            err = "device " + d.name + ": link layer must be ib or roce, not '" + ll + "'";
            return false;
        }
        d.roce = ll == "roce";
        size_t idx = out.size();
        // A fragment without '=' continues the previous value (pci=0000:af:00.1).
        std::vector<std::string> opts;
        for (size_t i = 2; i < parts.size(); ++i) {
            if (!opts.empty() && parts[i].find('=') == std::string::npos) opts.back() += ":" + parts[i];
            else opts.push_back(parts[i]);
        }
        for (const std::string &opt : opts) {
            std::string kv = strip(opt);
            size_t eq = kv.find('=');
            if (eq == std::string::npos || !parse_key(d, kv.substr(0, eq), kv.substr(eq + 1))) {
                err = "device " + d.name + ": bad option '" + kv + "'";
                return false;
            }
        }
        char pci[32];
        std::snprintf(pci, sizeof(pci), "0000:%02zx:00.0", (0x10 + idx) & 0xff);
        if (d.pci.empty()) d.pci = pci;
        if (d.gids == 0) d.gids = d.roce ? 2 : 1;
        if (d.roce && d.netdev.empty()) d.netdev = "sveth" + std::to_string(idx);
        if (d.roce && d.ipv4 == 0) d.ipv4 = (10u << 24) | (77u << 16) | ((idx & 0xff) << 8) | 1u;
        if (d.active_mtu == 0) d.active_mtu = d.roce ? 3 : 5;
        out.push_back(d);
    }
    return true;
}

}  // namespace sv
