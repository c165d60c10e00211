// A minimal test harness: TEST(name) registers a function, CHECK* record a
// failure with file and line and keep going, REQUIRE* stop the test.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace mctest {

struct Case {
    const char *name;
    std::function<void()> fn;
};

std::vector<Case> &registry();
void record_failure(const char *file, int line, const std::string &what);
// Marks the running test as skipped (it did not check what it is about);
// the harness reports it as SKIP with the reason and counts it apart.
void record_skip(const std::string &why);
struct Abort {};

struct Registrar {
    Registrar(const char *name, std::function<void()> fn) { registry().push_back({name, fn}); }
};

}  // namespace mctest

#define MC_CAT2(a, b) a##b
#define MC_CAT(a, b) MC_CAT2(a, b)
#define TEST(name)                                                          \
    static void name();                                                     \
    static ::mctest::Registrar MC_CAT(reg_, name)(#name, name);             \
    static void name()

#define CHECK(cond)                                                          \
    do {                                                                     \
        if (!(cond)) ::mctest::record_failure(__FILE__, __LINE__, #cond);    \
    } while (0)

#define CHECK_EQ(a, b)                                                       \
    do {                                                                     \
        auto mc_a_ = (a);                                                    \
        auto mc_b_ = (b);                                                    \
        if (!(mc_a_ == mc_b_)) {                                             \
            std::ostringstream mc_s_;                                        \
            mc_s_ << #a << " == " << #b << " (" << mc_a_ << " vs " << mc_b_ << ")"; \
            ::mctest::record_failure(__FILE__, __LINE__, mc_s_.str());       \
        }                                                                    \
    } while (0)

#define REQUIRE(cond)                                                        \
    do {                                                                     \
        if (!(cond)) {                                                       \
            ::mctest::record_failure(__FILE__, __LINE__, #cond);             \
            throw ::mctest::Abort{};                                         \
        }                                                                    \
    } while (0)

#define REQUIRE_EQ(a, b)                                                     \
    do {                                                                     \
        auto mc_a_ = (a);                                                    \
        auto mc_b_ = (b);                                                    \
        if (!(mc_a_ == mc_b_)) {                                             \
            std::ostringstream mc_s_;                                        \
            mc_s_ << #a << " == " << #b << " (" << mc_a_ << " vs " << mc_b_ << ")"; \
            ::mctest::record_failure(__FILE__, __LINE__, mc_s_.str());       \
            throw ::mctest::Abort{};                                         \
        }                                                                    \
    } while (0)
