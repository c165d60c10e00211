// Leveled logging with one process-wide sink. The default sink writes
// warnings and errors to stderr; embedders (the Rust crate) install their own
// sink to route engine logs into their logging framework.
#pragma once

#include <sstream>
#include <string>

namespace mcrs {

enum class LogLevel : int { Trace = 0, Debug = 1, Info = 2, Warn = 3, Error = 4, Off = 5 };

using LogSinkFn = void (*)(void *user_data, int level, const char *message);

// Installs `fn` (nullptr restores the stderr sink) and the minimum level that
// reaches it.
void set_log_sink(LogSinkFn fn, void *user_data, LogLevel min_level) noexcept;
// The minimum level alone (MC_LOG_LEVEL, applied by core/config.cpp at load).
void set_log_level(LogLevel min_level) noexcept;
bool log_enabled(LogLevel level) noexcept;
void log_message(LogLevel level, const std::string &message) noexcept;

}  // namespace mcrs

// MC_LOG(Warn, "connect to " << host << " failed"): builds the message only
// when the level is enabled.
#define MC_LOG(level, expr)                                               \
    do {                                                                  \
        if (::mcrs::log_enabled(::mcrs::LogLevel::level)) {               \
            std::ostringstream mc_log_stream_;                            \
            mc_log_stream_ << expr;                                       \
            ::mcrs::log_message(::mcrs::LogLevel::level, mc_log_stream_.str()); \
        }                                                                 \
    } while (0)
