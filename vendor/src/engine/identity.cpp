#include "engine/identity.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstring>

#include <fstream>

#include "common/random.h"

namespace mcrs {

std::string read_host_id() {
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::string id;
    std::getline(f, id);
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    return id.empty() ? std::string() : id + "@" + host;
}

const std::string &process_token() {
    static const std::string token = [] {
        unsigned char r[16] = {};
        random_bytes(r, sizeof r);
        static const char digits[] = "0123456789abcdef";
        std::string t;
        for (unsigned char b : r) {
            t.push_back(digits[b >> 4]);
            t.push_back(digits[b & 15]);
        }
        return t;
    }();
    return token;
}

std::string first_interface_address() {
    struct ifaddrs *all = nullptr;
    if (getifaddrs(&all) != 0) return std::string();
    std::string found;
    for (struct ifaddrs *i = all; i && found.empty(); i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        if (!(i->ifa_flags & IFF_UP) || !(i->ifa_flags & IFF_RUNNING)) continue;
        if (i->ifa_name && std::strcmp(i->ifa_name, "lo") == 0) continue;
        char text[INET_ADDRSTRLEN] = {0};
        const auto *in = reinterpret_cast<const struct sockaddr_in *>(i->ifa_addr);
        if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) found = text;
    }
    freeifaddrs(all);
    return found;
}

}  // namespace mcrs
