// Standard base64 (RFC 4648 section 4, '+' '/' and '=' padding), as etcd's
// JSON gateway encodes keys and values. Decoding is strict: the length is a
// multiple of four, padding only at the end, no whitespace or other
// characters, and the unused low bits of the last symbol are zero (only
// the canonical encoding of a byte string is accepted).
#pragma once

#include <string>
#include <string_view>

namespace mcrs {

std::string base64_encode(std::string_view in);
// False (and `out` unspecified) when `in` is not canonical base64.
bool base64_decode(std::string_view in, std::string &out);

}  // namespace mcrs
