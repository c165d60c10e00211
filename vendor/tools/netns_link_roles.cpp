// The netns link test's children (see netns_link_test.cpp): the initiator
// and the target, each an engine in its own network namespace answering one
// text line per command over pipes.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_ext.h"
#include "netns_link.h"

namespace netns_link {

// ---- engine side (runs in the children)

const char *g_role = "?";

void log_sink(void *, int level, const char *message) {
    static const char *names[] = {"trace", "debug", "info", "warn", "error"};
    auto t = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
    std::fprintf(stderr, "  [%s engine %s %lld] %s\n", g_role, names[std::min(std::max(level, 0), 4)],
                 static_cast<long long>(t % 100000), message);
}

namespace {

transfer_engine_t make_engine(const char *addr, std::string &why) {
    mc_engine_config_t c;
    mc_engine_config_default(&c);
    c.protocols = MC_PROTOCOL_TCP;
    c.local_server_name = addr;
    c.bind_address = addr;
    c.tcp_progress_timeout_ms = kProgressTimeoutMs;
    c.tcp_connect_timeout_ms = kConnectTimeoutMs;
    c.handshake_connect_timeout_ms = 3000;
    c.handshake_timeout_ms = 3000;
    // Every byte must cross the network, not a same-host shortcut.
    c.enable_same_host = 0;
    c.enable_cuda_ipc = 0;
    transfer_engine_t e = mc_engine_create(&c);
    if (!e) why = std::string("mc_engine_create(") + addr + "): " + mc_last_error_message();
    return e;
}

std::string seg_name(transfer_engine_t e) {
    char buf[128];
    size_t n = 0;
    if (mc_engine_segment_name(e, buf, sizeof buf, &n) != 0) return "";
    return buf;
}

struct Outcome {
    bool ended = false;  // every task terminal before the wait gave up
    int64_t ms = 0;
    int completed = 0, failed = 0, other = 0;
    std::string error;  // the first failed task's reason
};

batch_id_t submit(transfer_engine_t e, int op, char *local, segment_id_t seg, uint64_t remote,
                  uint64_t len, size_t &n, std::string &why) {
    std::vector<transfer_request> reqs;
    for (uint64_t off = 0; off < len; off += kTask)
        reqs.push_back(transfer_request{op, local + off, seg, remote + off, std::min(kTask, len - off)});
    n = reqs.size();
    batch_id_t b = allocateBatchID(e, n);
    if (b == INVALID_BATCH) {
        why = std::string("allocateBatchID: ") + mc_last_error_message();
        return b;
    }
    int rc = submitTransfer(e, b, reqs.data(), n);
    if (rc != 0) {
        why = "submitTransfer rc " + std::to_string(rc) + ": " + mc_last_error_message();
        freeBatchID(e, b);
        return INVALID_BATCH;
    }
    return b;
}

Outcome finish(transfer_engine_t e, batch_id_t b, size_t n, int64_t wait_ms) {
    Outcome o;
    auto t0 = Clock::now();
    o.ended = mc_batch_wait(e, b, wait_ms) == 0;
    o.ms = ms_since(t0);
    for (size_t i = 0; i < n; ++i) {
        transfer_status st{};
        getTransferStatus(e, b, i, &st);
        if (st.status == STATUS_COMPLETED) {
            ++o.completed;
        } else if (st.status == STATUS_FAILED) {
            ++o.failed;
            if (o.error.empty()) {
                char buf[512];
                size_t need = 0;
                mc_transfer_error(e, b, i, buf, sizeof buf, &need);
                o.error = buf;
            }
        } else {
            ++o.other;
        }
    }
    if (o.ended) freeBatchID(e, b);
    return o;
}

std::string counters(transfer_engine_t e) {
    mc_engine_counters_t c{};
    mc_engine_get_counters(e, &c);
    return "tcp_sent=" + std::to_string(c.tcp_requests_sent) +
           " tcp_served=" + std::to_string(c.tcp_requests_served) +
           " same_host=" + std::to_string(c.same_host_requests + c.same_host_served);
}

struct EngineHolder {
    transfer_engine_t e = nullptr;
    ~EngineHolder() {
        if (e) destroyTransferEngine(e);
    }
};

// The initiator's answer to "cut" (the link is down): the big transfer must
// end FAILED, with a reason, within the progress timeout plus the margin.
std::string judge_cut(transfer_engine_t e, batch_id_t cut_batch, size_t cut_n) {
    Outcome o = finish(e, cut_batch, cut_n, kHangMs);
    std::string d = "elapsed_ms=" + std::to_string(o.ms) + " completed=" + std::to_string(o.completed) +
                    " failed=" + std::to_string(o.failed) + " other=" + std::to_string(o.other) + " error=\"" +
                    o.error + "\"";
    if (!o.ended) return "fail HANG: not every task ended within " + std::to_string(kHangMs) + " ms; " + d;
    if (o.completed == static_cast<int>(cut_n))
        return "fail the whole transfer completed before the cut (link not slowed?); " + d;
    if (o.failed == 0 || o.other != 0) return "fail tasks that did not complete are not FAILED; " + d;
    if (o.error.empty()) return "fail a FAILED task has no reason (mc_transfer_error); " + d;
    if (o.ms > kProgressTimeoutMs + kMarginMs)
        return "fail FAILED too late: " + std::to_string(o.ms) + " ms > progress timeout " +
               std::to_string(kProgressTimeoutMs) + " + margin " + std::to_string(kMarginMs) + " ms; " + d;
    return "ok " + d;
}

// The initiator's answer to "xfer": a whole transfer of `len` bytes that
// must succeed; a READ is verified here, a WRITE by the target. The engine
// holds back new connects to a peer for a short while after one failed (and
// reports that failure meanwhile), so the first attempts right after the
// link is back may fail: retry every 250 ms, for at most kRetryMs.
std::string xfer_with_retry(transfer_engine_t e, char *buf, segment_id_t seg, uint64_t remote, int op,
                            uint64_t seed, uint64_t len) {
    std::string why;
    if (op == OPCODE_WRITE) fill(buf, len, seed);
    auto t0 = Clock::now();
    std::string first_error;
    for (int attempt = 1;; ++attempt) {
        if (op == OPCODE_READ) std::memset(buf, 0, len);
        size_t n = 0;
        batch_id_t b = submit(e, op, buf, seg, remote, len, n, why);
        if (b == INVALID_BATCH) return "fail " + why;
        Outcome o = finish(e, b, n, kHangMs);
        if (!o.ended) return "fail HANG: the transfer did not end within " + std::to_string(kHangMs) + " ms";
        if (o.completed == static_cast<int>(n)) {
            uint64_t bad = op == OPCODE_READ ? verify(buf, len, seed) : len;
            if (bad != len) return "fail READ bytes differ at offset " + std::to_string(bad);
            return "ok ms=" + std::to_string(o.ms) + " attempts=" + std::to_string(attempt) + " " + counters(e) +
                   (first_error.empty() ? "" : " first_error=\"" + first_error + "\"");
        }
        if (first_error.empty()) first_error = o.error;
        if (ms_since(t0) > kRetryMs)
            return "fail " + std::to_string(attempt) + " attempts in " + std::to_string(kRetryMs) +
                   " ms after the link came back failed; first: " + first_error + "; last: " + o.error;
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
}

}  // namespace

// The initiator: one engine on 10.231.0.1 and a 256 MiB buffer.
int initiator_main(int in, int out) {
    std::string why;
    EngineHolder h;
    h.e = make_engine(kAddrA, why);
    if (!h.e) return write_line(out, "fail " + why), 1;
    transfer_engine_t e = h.e;
    std::unique_ptr<char[]> buf(new char[kBig]);
    if (registerLocalMemory(e, buf.get(), kBig, "cpu:0", 1) != 0)
        return write_line(out, std::string("fail registerLocalMemory: ") + mc_last_error_message()), 1;
    write_line(out, "ready");

    LineReader rd(in);
    segment_id_t seg = -1;
    uint64_t remote = 0;
    batch_id_t cut_batch = INVALID_BATCH;
    size_t cut_n = 0;
    for (std::string line; rd.read(line, -1, why);) {
        auto w = words(line);
        if (w.empty()) continue;
        std::string reply;
        if (w[0] == "quit") {
            write_line(out, "ok");
            break;
        } else if (w[0] == "open" && w.size() == 3) {
            seg = openSegment(e, w[1].c_str());
            remote = std::strtoull(w[2].c_str(), nullptr, 0);
            reply = seg >= 0 ? "ok" : std::string("fail openSegment: ") + mc_last_error_message();
        } else if (w[0] == "start" && w.size() == 3) {
            // The big transfer; the parent cuts the link while it runs.
            const int op = w[1] == "W" ? OPCODE_WRITE : OPCODE_READ;
            if (op == OPCODE_WRITE) fill(buf.get(), kBig, std::strtoull(w[2].c_str(), nullptr, 0));
            cut_batch = submit(e, op, buf.get(), seg, remote, kBig, cut_n, why);
            reply = cut_batch != INVALID_BATCH ? "ok" : "fail " + why;
        } else if (w[0] == "cut") {
            // The link is down now: the transfer must end FAILED, in time.
            reply = judge_cut(e, cut_batch, cut_n);
            cut_batch = INVALID_BATCH;
        } else if (w[0] == "xfer" && w.size() == 4) {
            // A whole transfer that must succeed; a READ is verified here,
            // a WRITE by the target.
            const int op = w[1] == "W" ? OPCODE_WRITE : OPCODE_READ;
            const uint64_t seed = std::strtoull(w[2].c_str(), nullptr, 0);
            const uint64_t len = std::strtoull(w[3].c_str(), nullptr, 0);
            reply = xfer_with_retry(e, buf.get(), seg, remote, op, seed, len);
        } else {
            reply = "fail unknown command: " + line;
        }
        if (!write_line(out, reply)) break;
    }
    return 0;
}

// The target: engine T on 10.231.0.2 with a 256 MiB buffer and a small one,
// and engine L in the same namespace on 127.0.0.1, whose lane to T stays
// inside the namespace (lo): it does not cross the veth.
int target_main(int in, int out) {
    std::string why;
    EngineHolder th, lh;
    th.e = make_engine(kAddrB, why);
    if (th.e) lh.e = make_engine("127.0.0.1", why);
    if (!th.e || !lh.e) return write_line(out, "fail " + why), 1;
    transfer_engine_t t = th.e, l = lh.e;
    std::unique_ptr<char[]> big(new char[kBig]), small(new char[kSmall]), lbuf(new char[2 * kSmall]);
    if (registerLocalMemory(t, big.get(), kBig, "cpu:0", 1) != 0 ||
        registerLocalMemory(t, small.get(), kSmall, "cpu:0", 1) != 0 ||
        registerLocalMemory(l, lbuf.get(), 2 * kSmall, "cpu:0", 1) != 0)
        return write_line(out, std::string("fail registerLocalMemory: ") + mc_last_error_message()), 1;
    const std::string name = seg_name(t);
    segment_id_t lseg = openSegment(l, name.c_str());
    if (lseg < 0) return write_line(out, std::string("fail local openSegment: ") + mc_last_error_message()), 1;
    char addr[32];
    std::snprintf(addr, sizeof addr, "0x%" PRIxPTR, reinterpret_cast<uintptr_t>(big.get()));
    write_line(out, "ready " + name + " " + addr);

    LineReader rd(in);
    uint64_t local_seed = 1000;
    for (std::string line; rd.read(line, -1, why);) {
        auto w = words(line);
        if (w.empty()) continue;
        std::string reply;
        if (w[0] == "quit") {
            write_line(out, "ok");
            break;
        } else if ((w[0] == "fill" || w[0] == "check") && w.size() == 3) {
            // No transfer may still touch the buffer: a dead connection
            // must have been given up by now (progress timeout).
            auto t0 = Clock::now();
            int rc = mc_wait_region_idle(t, big.get(), kProgressTimeoutMs + kMarginMs);
            if (rc != 0) {
                reply = "fail the target's buffer is still in use " + std::to_string(ms_since(t0)) +
                        " ms later: " + mc_last_error_message();
            } else {
                const uint64_t seed = std::strtoull(w[1].c_str(), nullptr, 0);
                const uint64_t len = std::strtoull(w[2].c_str(), nullptr, 0);
                if (w[0] == "fill") {
                    fill(big.get(), len, seed);
                    reply = "ok";
                } else {
                    uint64_t bad = verify(big.get(), len, seed);
                    reply = bad == len ? "ok" : "fail WRITE bytes differ at offset " + std::to_string(bad);
                }
                reply += " idle_after_ms=" + std::to_string(ms_since(t0));
            }
        } else if (w[0] == "local") {
            // WRITE then READ back over the lane that stays in this namespace.
            const uint64_t seed = ++local_seed;
            fill(lbuf.get(), kSmall, seed);
            std::memset(lbuf.get() + kSmall, 0, kSmall);
            const uint64_t dst = reinterpret_cast<uintptr_t>(small.get());
            auto t0 = Clock::now();
            size_t n = 0;
            batch_id_t b = submit(l, OPCODE_WRITE, lbuf.get(), lseg, dst, kSmall, n, why);
            Outcome o;
            if (b != INVALID_BATCH) o = finish(l, b, n, kHangMs);
            if (b != INVALID_BATCH && o.completed == static_cast<int>(n)) {
                b = submit(l, OPCODE_READ, lbuf.get() + kSmall, lseg, dst, kSmall, n, why);
                if (b != INVALID_BATCH) o = finish(l, b, n, kHangMs);
            }
            if (b == INVALID_BATCH)
                reply = "fail " + why;
            else if (o.completed != static_cast<int>(n))
                reply = "fail the target did not serve the in-namespace lane: " + o.error;
            else if (verify(small.get(), kSmall, seed) != kSmall ||
                     verify(lbuf.get() + kSmall, kSmall, seed) != kSmall)
                reply = "fail in-namespace lane: bytes differ";
            else
                reply = "ok ms=" + std::to_string(ms_since(t0)) + " lane " + counters(l);
        } else if (w[0] == "counters") {
            reply = "ok " + counters(t);
        } else {
            reply = "fail unknown command: " + line;
        }
        if (!write_line(out, reply)) break;
    }
    return 0;
}

}  // namespace netns_link
