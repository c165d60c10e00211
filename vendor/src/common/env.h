// Reading MC_* and related environment variables with upstream's parsing
// rules. The engine reads them once, when a default configuration is built,
// never on a hot path.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace mcrs {

std::optional<std::string> env_string(const char *name);
bool env_present(const char *name);
// Upstream boolean parsing: 1/0, true/false, yes/no, on/off, enable/disable
// (case-insensitive, trimmed). Anything else keeps `fallback`.
bool env_bool(const char *name, bool fallback);
// Parses a bool value with the same rules; returns nullopt for anything else.
std::optional<bool> parse_bool(const std::string &value);
// An integer in [lo, hi]; unset, unparsable or out-of-range values give
// `fallback` (out-of-range values are logged).
int64_t env_int(const char *name, int64_t fallback, int64_t lo, int64_t hi);

std::string trim(const std::string &s);

}  // namespace mcrs
