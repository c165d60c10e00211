#include "engine/identity.h"

#include <unistd.h>

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

}  // namespace mcrs
