// Multi-host behaviour without loopback shortcuts: two network namespaces
// joined by a veth pair, one engine in each, bound to its own address. While
// a large WRITE (then a READ) crosses the veth, the link is cut. Checks:
//  1. the transfer ends FAILED, with a reason, within the progress timeout
//     plus a margin (and never hangs);
//  2. the target keeps serving: a lane inside its namespace that does not
//     cross the cut link moves verified bytes, during the stall and after;
//  3. the target releases its buffer (mc_wait_region_idle) once the dead
//     connection is given up;
//  4. with the link back up, a new transfer over the veth moves verified
//     bytes (and the veth counters show they crossed it).
//
// The parent stays in the root namespace, builds the network with `ip` and
// `tc` (tbf slows the link so that the transfer is reliably in flight), and
// forks one child per namespace; each child enters its namespace with
// setns() before any engine thread exists, then answers one text line per
// command over pipes. The namespaces (and with them the veth pair) are
// deleted in every exit path, also on SIGINT/SIGTERM/SIGHUP; children die
// with the parent (PR_SET_PDEATHSIG). Addresses come from 10.231.0.0/24,
// used only inside these namespaces.
//
//   make -C vendor netns-test     (root, or CAP_SYS_ADMIN + CAP_NET_ADMIN)
//
// Exit status: 0 passed, 0 skipped (namespaces or veth cannot be created
// here; MC_NETNS_REQUIRED=1 turns a skip into a failure), 1 failed.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_ext.h"

namespace {

constexpr uint32_t kProgressTimeoutMs = 2000;
constexpr uint32_t kConnectTimeoutMs = 1000;
// Allowed beyond the progress timeout before the failure must be reported:
// requests still queued behind the dead connection get one reconnect
// attempt (bounded by the connect timeout), plus slack for a loaded machine.
constexpr uint32_t kMarginMs = kConnectTimeoutMs + 1500;
constexpr int64_t kHangMs = 30000;          // "never ends" from here on
constexpr int64_t kRetryMs = 10000;         // to get a link that is back
constexpr uint64_t kBig = 256ull << 20;     // the transfer that gets cut
constexpr uint64_t kTask = 16ull << 20;     // split into tasks of this size
constexpr uint64_t kMovedBeforeCut = 16ull << 20;  // seen on the veth first
constexpr uint64_t kSmall = 8ull << 20;     // the lane that does not cross
constexpr uint64_t kRecover = 32ull << 20;  // after the link is back
constexpr const char *kAddrA = "10.231.0.1";  // initiator
constexpr const char *kAddrB = "10.231.0.2";  // target
constexpr const char *kRate = "400mbit";      // 256 MiB would take ~5.4 s

using Clock = std::chrono::steady_clock;

int64_t ms_since(Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// ---- byte patterns both sides can produce and check without shipping them

uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void fill(char *p, uint64_t len, uint64_t seed) {
    for (uint64_t i = 0; i < len / 8; ++i) {
        uint64_t w = mix(seed * 0x100000001b3ull + i);
        std::memcpy(p + 8 * i, &w, 8);
    }
}

// Offset of the first wrong 8-byte word, or `len` when all match.
uint64_t verify(const char *p, uint64_t len, uint64_t seed) {
    for (uint64_t i = 0; i < len / 8; ++i) {
        uint64_t w = mix(seed * 0x100000001b3ull + i);
        if (std::memcmp(p + 8 * i, &w, 8) != 0) return 8 * i;
    }
    return len;
}

// ---- one text line per message over pipes

bool write_line(int fd, std::string s) {
    for (char &c : s)
        if (c == '\n') c = ' ';
    s += '\n';
    size_t off = 0;
    while (off < s.size()) {
        ssize_t n = ::write(fd, s.data() + off, s.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        off += static_cast<size_t>(n);
    }
    return true;
}

class LineReader {
public:
    explicit LineReader(int fd) : fd_(fd) {}
    // false on EOF, error or timeout (timeout_ms < 0: none); `why` says which.
    bool read(std::string &line, int64_t timeout_ms, std::string &why) {
        auto start = Clock::now();
        for (;;) {
            size_t nl = buf_.find('\n');
            if (nl != std::string::npos) {
                line = buf_.substr(0, nl);
                buf_.erase(0, nl + 1);
                return true;
            }
            int wait = -1;
            if (timeout_ms >= 0) {
                int64_t left = timeout_ms - ms_since(start);
                if (left <= 0) {
                    why = "no answer within " + std::to_string(timeout_ms) + " ms";
                    return false;
                }
                wait = static_cast<int>(left);
            }
            pollfd p{fd_, POLLIN, 0};
            int r = ::poll(&p, 1, wait);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                why = std::string("poll: ") + std::strerror(errno);
                return false;
            }
            if (r == 0) continue;
            char tmp[4096];
            ssize_t n = ::read(fd_, tmp, sizeof tmp);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                why = "the child closed its pipe (exited or crashed)";
                return false;
            }
            buf_.append(tmp, static_cast<size_t>(n));
        }
    }

private:
    int fd_;
    std::string buf_;
};

std::vector<std::string> words(const std::string &s) {
    std::istringstream in(s);
    std::vector<std::string> out;
    for (std::string w; in >> w;) out.push_back(w);
    return out;
}

// ---- engine side (runs in the children)

const char *g_role = "?";

void log_sink(void *, int level, const char *message) {
    static const char *names[] = {"trace", "debug", "info", "warn", "error"};
    auto t = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
    std::fprintf(stderr, "  [%s engine %s %lld] %s\n", g_role, names[std::min(std::max(level, 0), 4)],
                 static_cast<long long>(t % 100000), message);
}

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
            Outcome o = finish(e, cut_batch, cut_n, kHangMs);
            std::string d = "elapsed_ms=" + std::to_string(o.ms) + " completed=" +
                            std::to_string(o.completed) + " failed=" + std::to_string(o.failed) +
                            " other=" + std::to_string(o.other) + " error=\"" + o.error + "\"";
            if (!o.ended)
                reply = "fail HANG: not every task ended within " + std::to_string(kHangMs) + " ms; " + d;
            else if (o.completed == static_cast<int>(cut_n))
                reply = "fail the whole transfer completed before the cut (link not slowed?); " + d;
            else if (o.failed == 0 || o.other != 0)
                reply = "fail tasks that did not complete are not FAILED; " + d;
            else if (o.error.empty())
                reply = "fail a FAILED task has no reason (mc_transfer_error); " + d;
            else if (o.ms > kProgressTimeoutMs + kMarginMs)
                reply = "fail FAILED too late: " + std::to_string(o.ms) + " ms > progress timeout " +
                        std::to_string(kProgressTimeoutMs) + " + margin " + std::to_string(kMarginMs) +
                        " ms; " + d;
            else
                reply = "ok " + d;
            cut_batch = INVALID_BATCH;
        } else if (w[0] == "xfer" && w.size() == 4) {
            // A whole transfer that must succeed; a READ is verified here,
            // a WRITE by the target.
            const int op = w[1] == "W" ? OPCODE_WRITE : OPCODE_READ;
            const uint64_t seed = std::strtoull(w[2].c_str(), nullptr, 0);
            const uint64_t len = std::strtoull(w[3].c_str(), nullptr, 0);
            // The engine holds back new connects to a peer for a short while
            // after one failed (and reports that failure meanwhile), so the
            // first attempts right after the link is back may fail: retry
            // every 250 ms, for at most kRetryMs.
            if (op == OPCODE_WRITE) fill(buf.get(), len, seed);
            auto t0 = Clock::now();
            std::string first_error;
            for (int attempt = 1;; ++attempt) {
                if (op == OPCODE_READ) std::memset(buf.get(), 0, len);
                size_t n = 0;
                batch_id_t b = submit(e, op, buf.get(), seg, remote, len, n, why);
                if (b == INVALID_BATCH) {
                    reply = "fail " + why;
                    break;
                }
                Outcome o = finish(e, b, n, kHangMs);
                if (!o.ended) {
                    reply = "fail HANG: the transfer did not end within " + std::to_string(kHangMs) + " ms";
                    break;
                }
                if (o.completed == static_cast<int>(n)) {
                    uint64_t bad = op == OPCODE_READ ? verify(buf.get(), len, seed) : len;
                    if (bad != len)
                        reply = "fail READ bytes differ at offset " + std::to_string(bad);
                    else
                        reply = "ok ms=" + std::to_string(o.ms) + " attempts=" + std::to_string(attempt) +
                                " " + counters(e) +
                                (first_error.empty() ? "" : " first_error=\"" + first_error + "\"");
                    break;
                }
                if (first_error.empty()) first_error = o.error;
                if (ms_since(t0) > kRetryMs) {
                    reply = "fail " + std::to_string(attempt) + " attempts in " + std::to_string(kRetryMs) +
                            " ms after the link came back failed; first: " + first_error +
                            "; last: " + o.error;
                    break;
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(250));
            }
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

// ---- the parent: network, children, cleanup

std::string g_ip, g_tc;          // absolute paths
char g_ns_names[2][64];          // for the signal handler
pid_t g_children[2] = {-1, -1};  // ditto
std::vector<int> g_parent_fds;   // parent's pipe ends, closed in children

std::string find_tool(const char *name) {
    std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
    path += ":/usr/sbin:/sbin:/usr/bin:/bin";
    std::istringstream in(path);
    for (std::string dir; std::getline(in, dir, ':');) {
        if (dir.empty()) continue;
        std::string p = dir + "/" + name;
        if (::access(p.c_str(), X_OK) == 0) return p;
    }
    return "";
}

// Runs a command (argv[0] an absolute path) and returns its exit status, or
// -1 when it could not run; stdout and stderr land in *output.
int run_cmd(const std::vector<std::string> &args, std::string *output = nullptr) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return -1;
    std::fflush(stdout);
    pid_t pid = ::fork();
    if (pid < 0) {
        ::close(p[0]);
        ::close(p[1]);
        return -1;
    }
    if (pid == 0) {
        ::dup2(p[1], 1);
        ::dup2(p[1], 2);
        std::vector<char *> av;
        for (const auto &a : args) av.push_back(const_cast<char *>(a.c_str()));
        av.push_back(nullptr);
        ::execv(av[0], av.data());
        _exit(127);
    }
    ::close(p[1]);
    std::string out;
    char buf[4096];
    for (;;) {
        ssize_t n = ::read(p[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        out.append(buf, static_cast<size_t>(n));
    }
    ::close(p[0]);
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    if (output) *output = out;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Signal-safe: kills our children and deletes our namespaces, then exits.
void on_signal(int sig) {
    for (pid_t p : g_children)
        if (p > 0) ::kill(p, SIGKILL);
    for (pid_t p : g_children)
        if (p > 0) ::waitpid(p, nullptr, 0);
    for (auto &ns : g_ns_names) {
        if (!ns[0]) continue;
        pid_t p = ::fork();
        if (p == 0) {
            char netns[] = "netns", del[] = "del";
            char *av[] = {const_cast<char *>(g_ip.c_str()), netns, del, ns, nullptr};
            ::execv(av[0], av);
            _exit(127);
        }
        if (p > 0) ::waitpid(p, nullptr, 0);
    }
    const char msg[] = "netns_link_test: interrupted; namespaces deleted\n";
    ssize_t ignored = ::write(2, msg, sizeof msg - 1);
    (void)ignored;
    _exit(128 + sig);
}

// Deletes namespaces left by an earlier run that was killed outright
// (SIGKILL): ours are named mcnt-<pid>-a/b, and that pid is gone.
void delete_stale_namespaces() {
    DIR *d = ::opendir("/run/netns");
    if (!d) return;
    std::vector<std::string> stale;
    while (dirent *ent = ::readdir(d)) {
        unsigned long pid = 0;
        char side = 0;
        if (std::sscanf(ent->d_name, "mcnt-%lu-%c", &pid, &side) == 2 && pid > 0 &&
            ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
            stale.push_back(ent->d_name);
    }
    ::closedir(d);
    for (const auto &ns : stale) {
        std::printf("deleting stale namespace %s (its test process is gone)\n", ns.c_str());
        run_cmd({g_ip, "netns", "del", ns});
    }
}

struct Child {
    const char *role = "";
    pid_t pid = -1;
    int to = -1, from = -1;
    std::unique_ptr<LineReader> rd;

    bool send(const std::string &cmd) { return write_line(to, cmd); }
    // One answer; false (with the reason in `why`) unless it starts "ok".
    bool ask(const std::string &cmd, std::string &answer, std::string &why, int64_t timeout_ms = 60000) {
        if (!cmd.empty() && !send(cmd)) {
            why = std::string(role) + ": cannot send '" + cmd + "' (child gone)";
            return false;
        }
        return answer_of(cmd, answer, why, timeout_ms);
    }
    bool answer_of(const std::string &cmd, std::string &answer, std::string &why, int64_t timeout_ms = 60000) {
        std::string err;
        if (!rd->read(answer, timeout_ms, err)) {
            why = std::string(role) + ": '" + cmd + "': " + err;
            return false;
        }
        if (answer.compare(0, 2, "ok") == 0 || answer.compare(0, 5, "ready") == 0) return true;
        why = std::string(role) + ": '" + cmd + "': " + answer;
        return false;
    }
};

// Everything the test creates, undone in the destructor: children first
// (asked to quit, killed if they do not), then the namespaces, which takes
// the veth pair with them.
struct World {
    std::string ns[2];   // a: initiator, b: target
    std::string dev[2];  // veth ends
    Child kids[2];
    bool made[2] = {false, false};

    ~World() {
        for (int i = 0; i < 2; ++i) {
            Child &k = kids[i];
            if (k.pid <= 0) continue;
            k.send("quit");
            ::close(k.to);
            auto t0 = Clock::now();
            int st = 0;
            while (::waitpid(k.pid, &st, WNOHANG) == 0) {
                if (ms_since(t0) > 15000) {
                    std::fprintf(stderr, "%s child %d does not exit; killing it\n", k.role, k.pid);
                    ::kill(k.pid, SIGKILL);
                    ::waitpid(k.pid, &st, 0);
                    break;
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
            ::close(k.from);
            g_children[i] = -1;
        }
        for (int i = 0; i < 2; ++i) {
            if (!made[i]) continue;
            std::string out;
            if (run_cmd({g_ip, "netns", "del", ns[i]}, &out) != 0)
                std::fprintf(stderr, "ip netns del %s: %s\n", ns[i].c_str(), out.c_str());
            g_ns_names[i][0] = 0;
        }
    }
};

enum class Setup { Ok, Skip, Fail };

Setup ip_step(const std::vector<std::string> &args, std::string &why, Setup on_error = Setup::Fail) {
    std::string out;
    if (run_cmd(args, &out) == 0) return Setup::Ok;
    why = "";
    for (size_t i = 0; i < args.size(); ++i) why += (i ? " " : "") + args[i];
    why += ": " + (out.empty() ? std::string("failed") : out);
    return on_error;
}

Setup build_network(World &w, std::string &why) {
    const std::string id = std::to_string(::getpid());
    const char side[2] = {'a', 'b'};
    const char *addr[2] = {kAddrA, kAddrB};
    for (int i = 0; i < 2; ++i) {
        w.ns[i] = "mcnt-" + id + "-" + side[i];
        w.dev[i] = "mcnt" + id + side[i];  // <= 15 characters
        std::snprintf(g_ns_names[i], sizeof g_ns_names[i], "%s", w.ns[i].c_str());
        Setup s = ip_step({g_ip, "netns", "add", w.ns[i]}, why, Setup::Skip);
        if (s != Setup::Ok) {
            g_ns_names[i][0] = 0;
            return s;
        }
        w.made[i] = true;
    }
    // Created in namespace a, the peer end moved to b: never in ours.
    if (Setup s = ip_step({g_ip, "-n", w.ns[0], "link", "add", w.dev[0], "type", "veth", "peer",
                           "name", w.dev[1], "netns", w.ns[1]},
                          why, Setup::Skip);
        s != Setup::Ok)
        return s;
    for (int i = 0; i < 2; ++i) {
        std::vector<std::vector<std::string>> steps = {
            {g_ip, "-n", w.ns[i], "addr", "add", std::string(addr[i]) + "/24", "dev", w.dev[i]},
            {g_ip, "-n", w.ns[i], "link", "set", "lo", "up"},
            {g_ip, "-n", w.ns[i], "link", "set", w.dev[i], "up"},
        };
        for (const auto &st : steps)
            if (Setup s = ip_step(st, why); s != Setup::Ok) return s;
        // Slow the link (egress of each end) so that the big transfer is
        // reliably in flight when it is cut.
        if (Setup s = ip_step({g_tc, "-n", w.ns[i], "qdisc", "add", "dev", w.dev[i], "root", "tbf",
                               "rate", kRate, "burst", "256kb", "latency", "50ms"},
                              why, Setup::Skip);
            s != Setup::Ok) {
            why += " (tc tbf is needed to slow the link)";
            return s;
        }
    }
    return Setup::Ok;
}

// Forks a child that enters namespace `ns` and runs `role_main`.
bool spawn(Child &k, int slot, const std::string &ns, const char *role,
           int (*role_main)(int, int), std::string &why) {
    int down[2], up[2];
    if (::pipe2(down, O_CLOEXEC) != 0 || ::pipe2(up, O_CLOEXEC) != 0) {
        why = std::string("pipe: ") + std::strerror(errno);
        return false;
    }
    const pid_t parent = ::getpid();
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t pid = ::fork();
    if (pid < 0) {
        why = std::string("fork: ") + std::strerror(errno);
        return false;
    }
    if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) _exit(1);
        for (int s : {SIGINT, SIGTERM, SIGHUP}) ::signal(s, SIG_DFL);
        for (int fd : g_parent_fds) ::close(fd);
        ::close(down[1]);
        ::close(up[0]);
        g_role = role;
        std::string path = "/run/netns/" + ns;
        int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
            int err = errno;
            write_line(up[1], std::string(err == EPERM ? "setns-eperm " : "fail setns ") + path + ": " +
                                  std::strerror(err));
            _exit(3);
        }
        ::close(fd);
        // MC_NETNS_TEST_DEBUG=1: the engines' debug log too.
        const char *dbg = std::getenv("MC_NETNS_TEST_DEBUG");
        mc_set_log_sink(log_sink, nullptr, dbg && *dbg == '1' ? MC_LOG_DEBUG : MC_LOG_WARN);
        int rc = role_main(down[0], up[1]);
        std::fflush(stderr);
        _exit(rc);
    }
    ::close(down[0]);
    ::close(up[1]);
    k.role = role;
    k.pid = pid;
    k.to = down[1];
    k.from = up[0];
    k.rd.reset(new LineReader(k.from));
    g_children[slot] = pid;
    g_parent_fds.push_back(k.to);
    g_parent_fds.push_back(k.from);
    return true;
}

// `ip -j link show` of one veth end, as JSON text.
bool link_json(const World &w, int i, std::string &out) {
    return run_cmd({g_ip, "-n", w.ns[i], "-s", "-j", "link", "show", "dev", w.dev[i]}, &out) == 0;
}

uint64_t json_u64(const std::string &js, const std::string &key_path) {
    size_t at = js.find(key_path);
    return at == std::string::npos ? 0 : std::strtoull(js.c_str() + at + key_path.size(), nullptr, 10);
}

// Bytes through the initiator's veth end so far, both directions.
bool veth_bytes(const World &w, uint64_t &total) {
    std::string js;
    if (!link_json(w, 0, js) || js.find("\"stats64\"") == std::string::npos) return false;
    total = json_u64(js, "\"rx\":{\"bytes\":") + json_u64(js, "\"tx\":{\"bytes\":");
    return true;
}

bool wait_link_up(const World &w, std::string &why) {
    auto t0 = Clock::now();
    for (;;) {
        bool up = true;
        for (int i = 0; i < 2; ++i) {
            std::string js;
            up = up && link_json(w, i, js) && js.find("\"operstate\":\"UP\"") != std::string::npos;
        }
        if (up) return true;
        if (ms_since(t0) > 10000) {
            why = "the veth pair is not up 10 s after 'link set up'";
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

#define STEP(expr)             \
    do {                       \
        if (!(expr)) return false; \
    } while (0)

// One scenario: `op` ("W" or "R") of 256 MiB, the link cut at end `cut`
// (0: initiator's, 1: target's) while it runs.
bool scenario(World &w, const char *op, int cut, uint64_t seed, std::string &why) {
    Child &ini = w.kids[0], &tgt = w.kids[1];
    const bool write = op[0] == 'W';
    const std::string big = std::to_string(kBig);
    std::string a;
    std::printf("\n-- %s of %" PRIu64 " MiB over the veth; the %s's end (%s) is cut mid-transfer\n",
                write ? "WRITE" : "READ", kBig >> 20, cut == 0 ? "initiator" : "target",
                w.dev[cut].c_str());
    if (!write) STEP(tgt.ask("fill " + std::to_string(seed) + " " + big, a, why));
    uint64_t base = 0, now = 0;
    STEP(veth_bytes(w, base) || (why = "cannot read the veth counters", false));
    auto t_start = Clock::now();
    STEP(ini.ask(std::string("start ") + op + " " + std::to_string(seed), a, why));
    // Cut only once bytes are moving over the veth.
    for (;;) {
        STEP(veth_bytes(w, now) || (why = "cannot read the veth counters", false));
        if (now - base >= kMovedBeforeCut) break;
        if (ms_since(t_start) > 20000) {
            why = "only " + std::to_string(now - base) + " bytes crossed the veth in 20 s";
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    STEP(ip_step({g_ip, "-n", w.ns[cut], "link", "set", "dev", w.dev[cut], "down"}, why) == Setup::Ok);
    std::printf("   link cut %" PRId64 " ms after submit, %" PRIu64 " MiB had crossed\n",
                ms_since(t_start), (now - base) >> 20);
    STEP(ini.send("cut") || (why = "initiator gone", false));
    // While the initiator waits for its failure, the target must serve a
    // lane that does not cross the cut link.
    STEP(tgt.ask("local", a, why));
    std::printf("   during the stall: in-namespace lane to the target %s\n", a.c_str());
    STEP(ini.answer_of("cut", a, why, kHangMs + 30000));
    std::printf("   %s ended FAILED: %s\n", write ? "WRITE" : "READ", a.c_str() + 3);
    STEP(tgt.ask("local", a, why));
    std::printf("   after the failure: in-namespace lane %s\n", a.c_str());
    // The target lets go of the buffer; the next step waits for that.
    STEP(ip_step({g_ip, "-n", w.ns[cut], "link", "set", "dev", w.dev[cut], "up"}, why) == Setup::Ok);
    STEP(wait_link_up(w, why));
    const std::string seed2 = std::to_string(seed + 1), len = std::to_string(kRecover);
    STEP(veth_bytes(w, base) || (why = "cannot read the veth counters", false));
    if (write) {
        STEP(ini.ask("xfer W " + seed2 + " " + len, a, why));
        std::printf("   link up: WRITE of %" PRIu64 " MiB %s\n", kRecover >> 20, a.c_str());
        STEP(tgt.ask("check " + seed2 + " " + len, a, why));
        std::printf("   target verified the bytes: %s\n", a.c_str());
    } else {
        STEP(tgt.ask("fill " + seed2 + " " + len, a, why));
        std::printf("   target buffer idle again: %s\n", a.c_str());
        STEP(ini.ask("xfer R " + seed2 + " " + len, a, why));
        std::printf("   link up: READ of %" PRIu64 " MiB verified, %s\n", kRecover >> 20, a.c_str());
    }
    STEP(veth_bytes(w, now) || (why = "cannot read the veth counters", false));
    if (now - base < kRecover) {
        why = "only " + std::to_string(now - base) + " bytes crossed the veth for a " +
              std::to_string(kRecover) + "-byte transfer";
        return false;
    }
    return true;
}

int skip(const std::string &why) {
    std::printf("SKIPPED: network namespaces are not available here: %s\n", why.c_str());
    const char *req = std::getenv("MC_NETNS_REQUIRED");
    if (req && std::strcmp(req, "1") == 0) {
        std::printf("MC_NETNS_REQUIRED=1: a skip counts as a failure\n");
        return 1;
    }
    return 0;
}

int parent_main() {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    auto t0 = Clock::now();
    g_ip = find_tool("ip");
    g_tc = find_tool("tc");
    if (g_ip.empty() || g_tc.empty())
        return skip("`ip`/`tc` not found (install iproute2; scripts/install-test-deps.sh does)");
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    for (int s : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(s, &sa, nullptr);
    delete_stale_namespaces();

    std::string why;
    bool ok = false;
    {
        World w;
        Setup s = build_network(w, why);
        if (s == Setup::Skip) return skip(why);
        if (s == Setup::Fail) {
            std::printf("FAILED: network setup: %s\n", why.c_str());
            return 1;
        }
        std::printf("namespaces %s (%s, initiator) and %s (%s, target), veth %s <-> %s shaped to %s\n",
                    w.ns[0].c_str(), kAddrA, w.ns[1].c_str(), kAddrB, w.dev[0].c_str(),
                    w.dev[1].c_str(), kRate);
        std::string a;
        ok = spawn(w.kids[0], 0, w.ns[0], "initiator", initiator_main, why) &&
             spawn(w.kids[1], 1, w.ns[1], "target", target_main, why);
        bool ready = ok && w.kids[1].answer_of("start", a, why, 60000);
        if (ok && !ready && a.compare(0, 11, "setns-eperm") == 0) return skip(a);
        std::vector<std::string> tw = words(a);
        ok = ready && tw.size() == 3 && w.kids[0].answer_of("start", a, why, 60000);
        if (ok) {
            std::printf("target segment %s (buffer at %s); progress timeout %u ms\n", tw[1].c_str(),
                        tw[2].c_str(), kProgressTimeoutMs);
            ok = w.kids[0].ask("open " + tw[1] + " " + tw[2], a, why) &&
                 scenario(w, "W", 1, 1, why) && scenario(w, "R", 0, 11, why);
        }
        if (ok) {
            ok = w.kids[1].ask("counters", a, why);
            if (ok) std::printf("\ntarget engine: %s\n", a.c_str());
        }
    }  // children stopped, namespaces deleted
    if (!ok) {
        std::printf("FAILED: %s\n", why.c_str());
        return 1;
    }
    std::printf("PASSED: netns link-cut test (%" PRId64 " ms, namespaces deleted)\n", ms_since(t0));
    return 0;
}

}  // namespace

int main() { return parent_main(); }
