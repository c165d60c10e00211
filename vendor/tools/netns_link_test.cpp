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
// used only inside these namespaces. The children's side is in
// netns_link_roles.cpp, what both share in netns_link.h.
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
#include "netns_link.h"

namespace {

using namespace netns_link;

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
