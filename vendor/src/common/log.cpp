#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace mcrs {
namespace {

struct SinkState {
    std::mutex mu;  // serialises sink replacement against delivery
    LogSinkFn fn = nullptr;
    void *user = nullptr;
};

SinkState &sink() {
    static SinkState s;
    return s;
}

std::atomic<int> &min_level() {
    static std::atomic<int> lvl{static_cast<int>(LogLevel::Warn)};
    return lvl;
}

const char *level_tag(LogLevel l) {
    switch (l) {
        case LogLevel::Trace: return "TRACE";
        case LogLevel::Debug: return "DEBUG";
        case LogLevel::Info: return "INFO";
        case LogLevel::Warn: return "WARN";
        case LogLevel::Error: return "ERROR";
        default: return "?";
    }
}

}  // namespace

void set_log_sink(LogSinkFn fn, void *user_data, LogLevel level) noexcept {
    SinkState &s = sink();
    std::lock_guard<std::mutex> g(s.mu);
    s.fn = fn;
    s.user = user_data;
    min_level().store(static_cast<int>(level), std::memory_order_relaxed);
}

void set_log_level(LogLevel level) noexcept {
    min_level().store(static_cast<int>(level), std::memory_order_relaxed);
}

bool log_enabled(LogLevel level) noexcept {
    return static_cast<int>(level) >= min_level().load(std::memory_order_relaxed);
}

void log_message(LogLevel level, const std::string &message) noexcept {
    SinkState &s = sink();
    std::lock_guard<std::mutex> g(s.mu);
    if (s.fn) {
        s.fn(s.user, static_cast<int>(level), message.c_str());
    } else {
        std::fprintf(stderr, "[mooncake-rs %s] %s\n", level_tag(level), message.c_str());
    }
}

}  // namespace mcrs
