// Small text helpers shared by every layer: addresses in messages, trimming,
// upstream's boolean spellings, and the one list parser every comma-separated
// setting goes through (environment variables and C API strings alike).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mcrs {

// "0x1f00": an address or size as error messages show it.
std::string hex(uint64_t v);

// Without leading and trailing spaces, tabs and line ends.
std::string trim(const std::string &s);

// Upstream's boolean spellings: 1/0, true/false, yes/no, on/off,
// enable/disable (case-insensitive, trimmed); nullopt for anything else.
std::optional<bool> parse_bool(const std::string &value);

// The list parser: items separated by ',' (';' is accepted too), each
// trimmed; empty items and repeats dropped, first occurrence order kept.
std::vector<std::string> split_list(const std::string &s);

// "a,b,c"; the inverse of split_list.
std::string join_list(const std::vector<std::string> &v);

}  // namespace mcrs
