// The TCP data server fed a whole hostile byte stream: request headers
// (READ/WRITE, v1/v2, any size and address), payloads, garbage, truncation.
// The bytes go to the engine's data port verbatim; the registered buffers
// sit at fixed addresses (fuzz_engine.h) so seeds and mutations can hit
// them, their edges, the local-only buffer and the guard pages. Findings:
// any sanitizer report, a guard or local-only byte changed, a server that
// does not close after our FIN.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fuzz_engine.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz::Engine &e = fuzz::engine();
    // Same starting contents for every input (READ answers are reproducible).
    for (size_t i = 0; i < fuzz::kRemoteLen; ++i)
        fuzz::remote_buf()[i] = static_cast<unsigned char>(i * 7);
    size_t threads = fuzz::thread_count();
    std::string reply = fuzz::exchange(e.data_port, data, size, 15000);
    if (std::getenv("MC_FUZZ_LOG")) std::fprintf(stderr, "reply: %zu bytes\n", reply.size());
    // The server closed: its connection thread is on its way out.
    fuzz::settle_threads(threads);
    fuzz::check_canaries();
    return 0;
}
