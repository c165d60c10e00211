// Random bytes from the kernel, for names and tokens peers must not guess.
#pragma once

#include <cstddef>

namespace mcrs {

// Fills `out` with `len` random bytes (getrandom, /dev/urandom as
// fallback); false when neither is available.
bool random_bytes(void *out, size_t len);

}  // namespace mcrs
