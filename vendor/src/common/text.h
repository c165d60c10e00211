// Small text helpers shared by every layer: addresses in messages and the
// comma-joined form of name lists.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mcrs {

// "0x1f00": an address or size as error messages show it.
std::string hex(uint64_t v);

// "a,b,c"; the inverse of the configuration's list parser.
std::string join_list(const std::vector<std::string> &v);

}  // namespace mcrs
