// Shared by the two halves of the netns link test (netns_link_test.cpp, the
// parent; netns_link_roles.cpp, the engines in the children): the test's
// constants, byte patterns both sides can produce and check, the
// one-line-per-message pipe protocol, and the children's entry points.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace netns_link {

constexpr uint32_t kProgressTimeoutMs = 2000;
constexpr uint32_t kConnectTimeoutMs = 1000;
// Allowed beyond the progress timeout before the failure must be reported:
// requests still queued behind the dead connection get one reconnect
// attempt (bounded by the connect timeout), plus slack for a loaded machine.
constexpr uint32_t kMarginMs = kConnectTimeoutMs + 1500;
constexpr int64_t kHangMs = 30000;          // "never ends" from here on
constexpr int64_t kRetryMs = 10000;         // to get a link that is back
constexpr uint64_t kBig = 256ull << 20;     // the transfer that gets cut
constexpr uint64_t kTask = 16ull << 20;     // split into tasks of this size
constexpr uint64_t kMovedBeforeCut = 16ull << 20;  // seen on the veth first
constexpr uint64_t kSmall = 8ull << 20;     // the lane that does not cross
constexpr uint64_t kRecover = 32ull << 20;  // after the link is back
constexpr const char *kAddrA = "10.231.0.1";  // initiator
constexpr const char *kAddrB = "10.231.0.2";  // target
constexpr const char *kRate = "400mbit";      // 256 MiB would take ~5.4 s

using Clock = std::chrono::steady_clock;

inline int64_t ms_since(Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// ---- byte patterns both sides can produce and check without shipping them

inline uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

inline void fill(char *p, uint64_t len, uint64_t seed) {
    for (uint64_t i = 0; i < len / 8; ++i) {
        uint64_t w = mix(seed * 0x100000001b3ull + i);
        std::memcpy(p + 8 * i, &w, 8);
    }
}

// Offset of the first wrong 8-byte word, or `len` when all match.
inline uint64_t verify(const char *p, uint64_t len, uint64_t seed) {
    for (uint64_t i = 0; i < len / 8; ++i) {
        uint64_t w = mix(seed * 0x100000001b3ull + i);
        if (std::memcmp(p + 8 * i, &w, 8) != 0) return 8 * i;
    }
    return len;
}

// ---- one text line per message over pipes

inline bool write_line(int fd, std::string s) {
    for (char &c : s)
        if (c == '\n') c = ' ';
    s += '\n';
    size_t off = 0;
    while (off < s.size()) {
        ssize_t n = ::write(fd, s.data() + off, s.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        off += static_cast<size_t>(n);
    }
    return true;
}

class LineReader {
public:
    explicit LineReader(int fd) : fd_(fd) {}
    // false on EOF, error or timeout (timeout_ms < 0: none); `why` says which.
    bool read(std::string &line, int64_t timeout_ms, std::string &why) {
        auto start = Clock::now();
        for (;;) {
            size_t nl = buf_.find('\n');
            if (nl != std::string::npos) {
                line = buf_.substr(0, nl);
                buf_.erase(0, nl + 1);
                return true;
            }
            int wait = -1;
            if (timeout_ms >= 0) {
                int64_t left = timeout_ms - ms_since(start);
                if (left <= 0) {
                    why = "no answer within " + std::to_string(timeout_ms) + " ms";
                    return false;
                }
                wait = static_cast<int>(left);
            }
            pollfd p{fd_, POLLIN, 0};
            int r = ::poll(&p, 1, wait);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                why = std::string("poll: ") + std::strerror(errno);
                return false;
            }
            if (r == 0) continue;
            char tmp[4096];
            ssize_t n = ::read(fd_, tmp, sizeof tmp);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                why = "the child closed its pipe (exited or crashed)";
                return false;
            }
            buf_.append(tmp, static_cast<size_t>(n));
        }
    }

private:
    int fd_;
    std::string buf_;
};

inline std::vector<std::string> words(const std::string &s) {
    std::istringstream in(s);
    std::vector<std::string> out;
    for (std::string w; in >> w;) out.push_back(w);
    return out;
}

// ---- engine side (netns_link_roles.cpp)

extern const char *g_role;  // "initiator" or "target", for log lines
void log_sink(void *, int level, const char *message);
int initiator_main(int in, int out);
int target_main(int in, int out);

}  // namespace netns_link
