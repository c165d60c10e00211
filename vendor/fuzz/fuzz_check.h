// Shared by the fuzz targets: a check that survives NDEBUG and says what
// broke before it aborts (libFuzzer then saves the input).
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, what)                                                        \
    do {                                                                              \
        if (!(cond)) {                                                                \
            std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s (%s)\n", __FILE__, \
                         __LINE__, #cond, what);                                      \
            std::abort();                                                             \
        }                                                                             \
    } while (0)
