#include <chrono>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "test_util.h"

namespace mctest {

std::vector<Case> &registry() {
    static std::vector<Case> r;
    return r;
}

namespace {
int g_failures = 0;
std::string g_skip_reason;  // set by record_skip for the running test
bool g_skipped = false;
}  // namespace

void record_skip(const std::string &why) {
    g_skipped = true;
    g_skip_reason = why;
}

void record_failure(const char *file, int line, const std::string &what) {
    ++g_failures;
    std::fprintf(stderr, "    FAILED %s:%d: %s\n", file, line, what.c_str());
}

}  // namespace mctest

int gpu_peer_main(int argc, char **argv);        // test_gpu.cpp
int same_host_peer_main(int argc, char **argv);  // test_same_host.cpp

int main(int argc, char **argv) {
    if (argc > 1 && std::strcmp(argv[1], "--gpu-peer") == 0) return gpu_peer_main(argc, argv);
    if (argc > 1 && std::strcmp(argv[1], "--same-host-peer") == 0) return same_host_peer_main(argc, argv);
    const char *filter = argc > 1 ? argv[1] : nullptr;
    int failed_cases = 0, ran = 0;
    std::vector<std::string> skipped;
    for (const auto &c : mctest::registry()) {
        // A filter matches anywhere in the name; "^name" matches a prefix.
        if (filter && (filter[0] == '^' ? std::strncmp(c.name, filter + 1, std::strlen(filter + 1)) != 0
                                        : !std::strstr(c.name, filter)))
            continue;
        ++ran;
        int before = mctest::g_failures;
        mctest::g_skipped = false;
        std::fprintf(stderr, "[ RUN  ] %s\n", c.name);
        auto started = std::chrono::steady_clock::now();
        try {
            c.fn();
        } catch (const mctest::Abort &) {
        } catch (const std::exception &e) {
            mctest::record_failure(__FILE__, __LINE__, std::string("exception: ") + e.what());
        }
        // Per-case time, so a slow case is visible in CI logs.
        long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                             started)
                           .count();
        bool ok = mctest::g_failures == before;
        if (!ok) {
            ++failed_cases;
            std::fprintf(stderr, "[ FAIL ] %s (%lld ms)\n", c.name, ms);
        } else if (mctest::g_skipped) {
            skipped.push_back(c.name);
            std::fprintf(stderr, "[ SKIP ] %s (%lld ms): %s\n", c.name, ms, mctest::g_skip_reason.c_str());
        } else {
            std::fprintf(stderr, "[  OK  ] %s (%lld ms)\n", c.name, ms);
        }
    }
    std::fprintf(stderr, "%d test(s): %d passed, %zu skipped, %d failed\n", ran,
                 ran - failed_cases - static_cast<int>(skipped.size()), skipped.size(), failed_cases);
    for (const auto &name : skipped) std::fprintf(stderr, "  skipped: %s\n", name.c_str());
    return failed_cases == 0 ? 0 : 1;
}
