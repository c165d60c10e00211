// Real metadata servers for the metadata store tests (test_metadata_store.cpp):
// etcd members and redis-server started as child processes on free
// 127.0.0.1 ports, their data in a temporary directory, stopped by PID.
// Also FakeServer, a scripted TCP server thread used only for faults a real
// server cannot produce (garbage, huge lengths, silence, early close).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/socket.h"
#include "metadata/base64.h"
#include "metadata/http_client.h"
#include "metadata/stores.h"
#include "rdma_tmp_dir.h"
#include "test_util.h"

extern char **environ;

namespace mdtest {

using Clock = std::chrono::steady_clock;

inline long long ms_since(Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

inline void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// Polls `cond` every 50 ms for up to `ms`; true once it holds.
inline bool wait_until(int ms, const std::function<bool()> &cond) {
    auto end = Clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
        if (cond()) return true;
        if (Clock::now() >= end) return false;
        sleep_ms(50);
    }
}

// The path of `name` in $PATH (or /usr/bin, /usr/local/bin); "" if none.
inline std::string which(const std::string &name) {
    std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
    path += ":/usr/bin:/usr/local/bin";
    size_t start = 0;
    while (start <= path.size()) {
        size_t end = path.find(':', start);
        if (end == std::string::npos) end = path.size();
        std::string dir = path.substr(start, end - start);
        start = end + 1;
        if (dir.empty()) continue;
        std::string p = dir + "/" + name;
        if (::access(p.c_str(), X_OK) == 0) return p;
    }
    return "";
}

// True when the servers must be there (CI): a missing binary fails the
// test instead of skipping it.
inline bool servers_required() {
    const char *v = std::getenv("MC_REQUIRE_METADATA_SERVERS");
    return v && std::strcmp(v, "1") == 0;
}

// Finds `name` or skips (fails when servers_required()); "" means: return.
inline std::string server_binary(const std::string &name) {
    std::string p = which(name);
    if (p.empty()) {
        if (servers_required())
            mctest::record_failure(__FILE__, __LINE__, name + " not found and MC_REQUIRE_METADATA_SERVERS=1");
        else
            mctest::record_skip(name + " not installed");
    }
    return p;
}

// A free TCP port on 127.0.0.1 (bound, then released: another process
// could take it in between, which is unlikely enough here).
inline uint16_t free_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    uint16_t port = 0;
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) ::close(fd);
    return port;
}

// A child process with stdout and stderr in `log`, stopped by PID.
class Child {
public:
    Child() = default;
    Child(const Child &) = delete;
    Child &operator=(const Child &) = delete;
    ~Child() { kill_now(); }

    bool start(const std::vector<std::string> &argv, const std::string &log) {
        kill_now();
        std::vector<char *> args;
        for (const auto &a : argv) args.push_back(const_cast<char *>(a.c_str()));
        args.push_back(nullptr);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        posix_spawn_file_actions_adddup2(&fa, 1, 2);
        pid_t pid = -1;
        int rc = posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
        posix_spawn_file_actions_destroy(&fa);
        if (rc != 0) return false;
        pid_ = pid;
        return true;
    }
    bool running() const { return pid_ > 0; }
    pid_t pid() const { return pid_; }
    // SIGSTOP / SIGCONT: a hung server whose kernel still accepts
    // connections, a fault no fake is needed for.
    void pause() const {
        if (pid_ > 0) ::kill(pid_, SIGSTOP);
    }
    void resume() const {
        if (pid_ > 0) ::kill(pid_, SIGCONT);
    }
    // SIGKILL (a crash) and reap.
    void kill_now() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGKILL);
        int st = 0;
        ::waitpid(pid_, &st, 0);
        pid_ = -1;
    }

private:
    pid_t pid_ = -1;
};

// One HTTP request to 127.0.0.1:port; status 0 when it failed.
inline mcrs::HttpResponse http_to(uint16_t port, const std::string &method, const std::string &target,
                                  const std::string *body = nullptr, int timeout_ms = 1000) {
    mcrs::HttpRequest req;
    req.method = method;
    req.target = target;
    if (body) {
        req.send_body = true;
        req.body = *body;
        req.content_type = "application/json";
    }
    mcrs::IoDeadline dl;
    dl.deadline = mcrs::MdClock::now() + std::chrono::milliseconds(timeout_ms);
    try {
        return mcrs::http_request("127.0.0.1", port, req, mcrs::HttpLimits(), 500, dl);
    } catch (const std::exception &) {
        return mcrs::HttpResponse();
    }
}

// Shorter raft timings than etcd's defaults (100 ms heartbeat, 1 s
// election): a member elects itself, and a cluster replaces a killed
// leader, in well under a second.
inline std::vector<std::string> fast_election() {
    return {"--heartbeat-interval", "50", "--election-timeout", "500"};
}

// One etcd member; data in <dir>/<name>.
class EtcdMember {
public:
    std::string name;
    uint16_t client_port = 0, peer_port = 0;

    EtcdMember(std::string n, const std::string &dir) : name(std::move(n)), dir_(dir) {
        client_port = free_port();
        peer_port = free_port();
    }
    std::string client_url() const { return "http://127.0.0.1:" + std::to_string(client_port); }
    std::string peer_url() const { return "http://127.0.0.1:" + std::to_string(peer_port); }
    std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port); }

    // `cluster`: "a=http://...,b=http://...". Same data dir on a restart.
    // `extra`: more flags (e.g. shorter election timeouts).
    bool start(const std::string &binary, const std::string &cluster, const std::vector<std::string> &extra = {}) {
        std::vector<std::string> argv{binary, "--name", name, "--data-dir", dir_ + "/" + name,
                                      "--listen-client-urls", client_url(), "--advertise-client-urls", client_url(),
                                      "--listen-peer-urls", peer_url(), "--initial-advertise-peer-urls", peer_url(),
                                      "--initial-cluster", cluster, "--initial-cluster-state", "new",
                                      "--initial-cluster-token", "mc-test"};
        argv.insert(argv.end(), extra.begin(), extra.end());
        return child_.start(argv, dir_ + "/" + name + ".log");
    }
    // Answers /health with {"health":"true"} (it has a leader) within `ms`.
    bool wait_healthy(int ms) const {
        return wait_until(ms, [&] {
            mcrs::HttpResponse r = http_to(client_port, "GET", "/health", nullptr, 500);
            return r.status == 200 && r.body.find("\"true\"") != std::string::npos;
        });
    }
    void kill_now() { child_.kill_now(); }
    void pause() const { child_.pause(); }
    void resume() const { child_.resume(); }
    bool running() const { return child_.running(); }

private:
    std::string dir_;
    Child child_;
};

// A single-member etcd in its own temporary directory.
class EtcdServer {
public:
    explicit EtcdServer(const std::string &binary) : binary_(binary), member_("m0", tmp_.path()) {}
    // Also a restart: the same ports and data directory.
    bool start() {
        return member_.start(binary_, member_.name + "=" + member_.peer_url(), fast_election()) &&
               member_.wait_healthy(15000);
    }
    void kill_now() { member_.kill_now(); }
    void pause() const { member_.pause(); }
    void resume() const { member_.resume(); }
    uint16_t port() const { return member_.client_port; }
    std::string endpoint() const { return member_.endpoint(); }
    const std::string &dir() const { return tmp_.path(); }

private:
    mctest::TmpDir tmp_;
    std::string binary_;
    EtcdMember member_;
};

// The value under `key` as etcd's gateway returns it (decoded); false when
// there is none or etcd does not answer.
inline bool etcd_raw_get(uint16_t port, const std::string &key, std::string &value) {
    std::string body = "{\"key\":\"" + mcrs::base64_encode(key) + "\"}";
    mcrs::HttpResponse r = http_to(port, "POST", "/v3/kv/range", &body);
    if (r.status != 200) return false;
    mcrs::Json j = mcrs::Json::parse(r.body);
    const mcrs::Json *kvs = j.find("kvs");
    if (!kvs || !kvs->get_array() || kvs->get_array()->empty()) return false;
    std::string v;
    mcrs::base64_decode(mcrs::json_string_or((*kvs->get_array())[0], "value", ""), v);
    value = v;
    return true;
}

// Runs a command, returns its stdout (at most 1 MiB) and exit status.
inline int run_capture(const std::string &cmd, std::string &out) {
    out.clear();
    FILE *f = ::popen(cmd.c_str(), "r");
    if (!f) return -1;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0 && out.size() < (1u << 20)) out.append(buf, n);
    int st = ::pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// redis-server on a free port with `password` (none when empty), no
// persistence, files in its own temporary directory.
class RedisServer {
public:
    RedisServer(const std::string &binary, std::string password) : binary_(binary), password_(std::move(password)) {
        port_ = free_port();
    }
    bool start() {
        std::vector<std::string> argv{binary_, "--port", std::to_string(port_), "--bind", "127.0.0.1", "--save",
                                      "", "--appendonly", "no", "--dir", tmp_.path(), "--daemonize", "no",
                                      "--protected-mode", "yes"};
        if (!password_.empty()) {
            argv.push_back("--requirepass");
            argv.push_back(password_);
        }
        if (!child_.start(argv, tmp_.path() + "/redis.log")) return false;
        return wait_until(10000, [&] {
            mcrs::RespReply r;
            return raw({"PING"}, r) && r.type == mcrs::RespReply::Type::Simple;
        });
    }
    void kill_now() { child_.kill_now(); }
    void pause() const { child_.pause(); }
    void resume() const { child_.resume(); }
    uint16_t port() const { return port_; }
    std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

    // One command on a new connection (AUTH and SELECT db first), parsed
    // with the store's parser; false when the server cannot be reached.
    bool raw(const std::vector<std::string> &args, mcrs::RespReply &out, int db = 0) const {
        std::vector<std::vector<std::string>> cmds;
        if (!password_.empty()) cmds.push_back({"AUTH", password_});
        if (db != 0) cmds.push_back({"SELECT", std::to_string(db)});
        cmds.push_back(args);
        std::string msg;
        for (const auto &c : cmds) {
            msg += "*" + std::to_string(c.size()) + "\r\n";
            for (const auto &a : c) msg += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
        }
        mcrs::IoDeadline dl;
        dl.deadline = mcrs::MdClock::now() + std::chrono::milliseconds(1000);
        std::string why;
        mcrs::Fd fd = mcrs::connect_until("127.0.0.1", port_, 500, dl, why);
        if (!fd.valid()) return false;
        if (mcrs::send_all_until(fd.get(), msg, dl).end != mcrs::IoEnd::Ok) return false;
        std::string buf;
        mcrs::RespLimits lim;
        size_t replies = 0;
        while (replies < cmds.size()) {
            mcrs::RespReply r;
            size_t used = 0;
            try {
                used = mcrs::parse_resp_reply(buf, lim, "test", r);
            } catch (const std::exception &) {
                return false;
            }
            if (used == 0) {
                if (mcrs::recv_some_until(fd.get(), buf, 65536, dl).end != mcrs::IoEnd::Ok) return false;
                continue;
            }
            buf.erase(0, used);
            ++replies;
            if (replies == cmds.size()) out = std::move(r);
        }
        return true;
    }

private:
    mctest::TmpDir tmp_;
    std::string binary_, password_;
    uint16_t port_ = 0;
    Child child_;
};

// FAKE server, for faults a real server cannot produce. Serves one
// connection at a time on 127.0.0.1: reads until `complete(received)`
// says the request is all there, then sends `reply(received)` and closes
// (or, with hang, keeps the connection open and silent until stopped).
// `complete` returning false forever makes a server that never answers.
class FakeServer {
public:
    using Complete = std::function<bool(const std::string &)>;
    using Reply = std::function<std::string(const std::string &)>;

    FakeServer(Complete complete, Reply reply, bool hang = false)
        : complete_(std::move(complete)), reply_(std::move(reply)), hang_(hang) {
        std::string err;
        listen_ = mcrs::listen_tcp_random("127.0.0.1", 20000, 60000, 50, 16, port_, err);
        if (listen_.valid()) thread_ = std::thread([this] { loop(); });
    }
    ~FakeServer() {
        wake_.wake();
        if (thread_.joinable()) thread_.join();
    }
    FakeServer(const FakeServer &) = delete;
    FakeServer &operator=(const FakeServer &) = delete;

    bool ok() const { return listen_.valid(); }
    uint16_t port() const { return port_; }
    // What each connection sent (as far as it was read).
    std::vector<std::string> received() {
        std::lock_guard<std::mutex> lk(mu_);
        return received_;
    }

private:
    void loop() {
        for (;;) {
            int r = mcrs::wait_readable(listen_.get(), wake_.read_fd(), -1);
            if (r < 0) return;
            mcrs::Fd c(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
            if (!c.valid()) continue;
            std::string got;
            bool stop = false;
            for (;;) {
                if (complete_(got)) break;
                int w = mcrs::wait_readable(c.get(), wake_.read_fd(), -1);
                if (w < 0) {
                    stop = true;
                    break;
                }
                char buf[65536];
                ssize_t n = ::recv(c.get(), buf, sizeof buf, 0);
                if (n <= 0) break;
                got.append(buf, static_cast<size_t>(n));
            }
            {
                std::lock_guard<std::mutex> lk(mu_);
                received_.push_back(got);
            }
            if (stop) return;
            if (!complete_(got)) continue;  // the client went away first
            std::string out = reply_(got);
            mcrs::send_all(c.get(), out.data(), out.size());
            if (hang_) {
                if (mcrs::wait_readable(wake_.read_fd(), -1, -1) != 0) return;
            }
        }
    }

    Complete complete_;
    Reply reply_;
    bool hang_;
    mcrs::Fd listen_;
    uint16_t port_ = 0;
    mcrs::WakePipe wake_;
    std::thread thread_;
    std::mutex mu_;
    std::vector<std::string> received_;
};

// A whole HTTP request (head and Content-Length body) is in `s`.
inline bool http_request_complete(const std::string &s) {
    size_t end = s.find("\r\n\r\n");
    if (end == std::string::npos) return false;
    size_t len = 0;
    std::string head = s.substr(0, end);
    for (char &c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    size_t cl = head.find("\r\ncontent-length:");
    if (cl != std::string::npos) len = std::strtoul(head.c_str() + cl + 17, nullptr, 10);
    return s.size() >= end + 4 + len;
}

}  // namespace mdtest
