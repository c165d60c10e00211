// The engine's handshake port fed a whole hostile byte stream: frames of
// any type and length, legacy framing, bad JSON, truncation. Findings: any
// sanitizer report, a server that does not close after our FIN, a reply
// that is not one well-formed frame answering the request's type, or
// registered memory touched.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/error.h"
#include "common/json.h"
#include "fuzz_engine.h"
#include "handshake/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz::Engine &e = fuzz::engine();
    std::string reply = fuzz::exchange(e.rpc_port, data, size, 15000);
    // Notifications a frame queued: drop them, so each input starts alike.
    int n = 0;
    if (notify_msg_t *msgs = getNotifsFromEngine(e.engine, &n)) freeNotifsMsgBuf(msgs, n);
    fuzz::check_canaries();
    if (reply.empty()) return 0;
    // Something was answered: it must be one frame, for a request we sent.
    FUZZ_CHECK(size >= mcrs::kFrameHeaderLen, "a reply to less than a header");
    uint64_t req_len = mcrs::decode_frame_length(data);
    FUZZ_CHECK(req_len > 0 && req_len <= size - mcrs::kFrameHeaderLen, "a reply to a partial frame");
    mcrs::FrameBody req = mcrs::split_frame_body(
        std::string_view(reinterpret_cast<const char *>(data + mcrs::kFrameHeaderLen),
                         static_cast<size_t>(req_len)));
    FUZZ_CHECK(reply.size() > mcrs::kFrameHeaderLen, "a reply shorter than a header");
    uint64_t len = mcrs::decode_frame_length(reinterpret_cast<const unsigned char *>(reply.data()));
    FUZZ_CHECK(len == reply.size() - mcrs::kFrameHeaderLen, "the reply's length is wrong");
    mcrs::FrameBody fb = mcrs::split_frame_body(std::string_view(reply).substr(mcrs::kFrameHeaderLen));
    FUZZ_CHECK(fb.type == req.type, "the reply's type differs from the request's");
    try {
        mcrs::Json::parse(fb.json);
    } catch (const mcrs::Error &err) {
        FUZZ_CHECK(false, err.what());
    }
    return 0;
}
