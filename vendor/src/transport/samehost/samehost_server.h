// The same-host target: accepts connections on its abstract Unix socket,
// lets in only kernel-attested processes (peer_identity.h: same uid,
// another process, visible pid, live pidfd) and serves their requests
// (samehost_wire.h) by copying between its registered memory and the
// initiator's memory with process_vm_readv/writev.
//
// Every target range goes through the one range check the TCP server uses,
// registry.pin(addr, len, need_remote=true), and must be host memory; the
// pin holds the buffer while its bytes move. The initiator's address is not
// checked against anything: the target cannot know the initiator's memory,
// and the only process it ever copies into or out of is the attested peer
// itself, so a bad initiator address can harm only that peer (the copy
// fails, EFAULT, the request answers COPY_FAILED and the connection stays).
//
// One thread per connection: acceptable because only attested same-uid
// processes get past accept, and connections are capped. Attestation uses
// only non-blocking syscalls, so a client can never stall the acceptor.
// Each connection is closed after `idle_timeout_ms` without a request; a
// request that arrives in part must complete within `progress_timeout_ms`.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/socket.h"
#include "core/memory_registry.h"

namespace mcrs {

struct CmaPiece;

struct SameHostServerOptions {
    uint32_t max_connections = 64;
    uint32_t idle_timeout_ms = 60000;
    uint32_t progress_timeout_ms = 30000;
};

class SameHostServer {
public:
    // Binds a fresh abstract socket. Throws Error(kErrSocket) on failure.
    SameHostServer(const MemoryRegistry &registry, SameHostServerOptions opt);
    ~SameHostServer();
    SameHostServer(const SameHostServer &) = delete;
    SameHostServer &operator=(const SameHostServer &) = delete;

    const std::string &socket_name() const { return name_; }
    void start();
    void stop();
    uint64_t served() const { return served_.load(); }
    uint64_t rejected() const { return rejected_.load(); }
    uint64_t refused_connections() const { return refused_.load(); }

private:
    struct Session {
        Fd fd;
        Fd pidfd;
        pid_t pid = 0;
        std::thread thread;
        std::atomic<bool> done{false};
    };
    void accept_loop();
    struct Checked;
    void serve(Session *s);
    // The steps of serve(): the copy permission check, one read of request
    // bytes (false: close), the range checks of the whole requests in
    // in[off, have) (their count), and the copies of the accepted ones.
    bool may_attach(const Session &s);
    bool receive_more(const Session &s, unsigned char *in, size_t cap, size_t &have);
    size_t check_requests(const Session &s, const unsigned char *in, size_t have, Checked *batch,
                          size_t &off, bool &close_after);
    void copy_requests(const Session &s, Checked *batch, size_t nb, CmaPiece *pieces);
    void reap_finished();  // caller holds mu_

    const MemoryRegistry &registry_;
    SameHostServerOptions opt_;
    std::string name_;
    Fd listener_;
    WakePipe wake_;
    std::thread acceptor_;
    std::atomic<bool> stopping_{false};
    std::mutex mu_;
    std::list<std::unique_ptr<Session>> sessions_;
    std::atomic<uint64_t> served_{0};
    std::atomic<uint64_t> rejected_{0};
    std::atomic<uint64_t> refused_{0};
};

}  // namespace mcrs
