#include "transport/tcp/tcp_client.h"

#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "common/error.h"
#include "common/host_port.h"
#include "common/log.h"
#include "gpu/gpu.h"
#include "transport/tcp/tcp_wire.h"

namespace mcrs {

namespace {

using Clock = std::chrono::steady_clock;

// A sender takes at most this many bytes of requests at once, so that big
// transfers spread over the lanes while small ones share syscalls.
constexpr uint64_t kCoalesceBytes = 1u << 20;
// Answers read by one receiver pass (two iovec entries each at most).
constexpr size_t kMaxRecvBatch = 128;
// iovec entries per sendmsg (IOV_MAX is 1024).
constexpr size_t kMaxSendIov = 512;

struct Queued {
    TransferItem item;
    int version = 2;
};

std::string describe(const TransferItem &it, const std::string &peer) {
    std::ostringstream s;
    s << (it.opcode == kTcpOpWrite ? "WRITE" : "READ") << " of " << it.length
      << " bytes at remote 0x" << std::hex << it.remote_addr << std::dec << " on " << peer;
    return s.str();
}

}  // namespace

class Lane;

class TcpClient::Peer {
public:
    Peer(std::string host, uint16_t port, const TcpClientOptions &opt);
    ~Peer();

    void enqueue(std::vector<TransferItem> &items, int version);
    // Blocks until items are available, then moves up to `max_items` of them
    // (at least one; at most kCoalesceBytes of requests unless the first
    // alone is bigger) into `out`. False once the peer is stopping.
    bool pop_many(std::vector<Queued> &out, size_t max_items);
    void stop();

    const std::string host;
    const uint16_t port;
    const std::string label;  // "host:port" for messages
    const TcpClientOptions opt;

    // Connect failures are shared by all lanes: after one, lanes that have no
    // connection fail their items at once for a short cool-down instead of
    // each waiting out its own connect timeout.
    bool recent_connect_failure(std::string &why);
    void note_connect_failure(const std::string &why);

private:
    std::mutex mu_;
    std::condition_variable cv_;
    Ring<Queued> queue_{256};
    bool stopping_ = false;
    Clock::time_point failed_at_{};
    std::string failure_;
    std::vector<std::unique_ptr<Lane>> lanes_;
};

// One persistent connection with a sender and a receiver thread.
class Lane {
public:
    Lane(TcpClient::Peer &peer, int index)
        : peer_(peer), index_(index), inflight_(peer.opt.pipeline_depth) {
        done_.reserve(kMaxRecvBatch);
    }
    void start() {
        sender_ = std::thread([this] { send_loop(); });
        receiver_ = std::thread([this] { receive_loop(); });
    }
    void stop() {
        {
            std::lock_guard<std::mutex> g(mu_);
            stop_ = true;
            mark_broken_locked();
            cv_.notify_all();
        }
        if (sender_.joinable()) sender_.join();
        if (receiver_.joinable()) receiver_.join();
    }

private:
    struct Inflight {
        TransferItem item;
        int version = 2;
        bool sent = false;
    };
    // Whether the receiver must wait until the sender is done with the entry
    // before reading its answer: only for payload WRITEs, whose OK may only
    // count once every byte is out (and whose early REJECTED aborts them).
    // Other answers can only come once their header has reached the peer;
    // reading them meanwhile keeps a peer that is blocked sending READ data
    // from blocking a sender that is still pushing a big WRITE run.
    static bool needs_sent(const Inflight &e) { return e.item.opcode == kTcpOpWrite; }

    void mark_broken_locked() {
        broken_ = true;
        if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
    }

    bool connect_locked(std::unique_lock<std::mutex> &lk, std::string &why);
    void send_loop();
    void receive_loop();
    bool read_one(int sock, Inflight &e, std::string &why);
    // Reads the answers of the first `n` (sent, host-memory, v2) entries.
    // Completes entries as their answers arrive; returns false with `why`
    // when the connection must be dropped.
    bool read_batch(std::unique_lock<std::mutex> &lk, size_t n, std::string &why);
    // Drops the connection and fails everything in flight (the first entry
    // with `why`).
    void fail_all_locked(std::unique_lock<std::mutex> &lk, std::string why);

    TcpClient::Peer &peer_;
    int index_;
    std::mutex mu_;
    std::condition_variable cv_;
    Fd fd_;
    bool broken_ = false;
    bool stop_ = false;
    bool sending_ = false;
    bool receiver_busy_ = false;
    std::string send_error_;  // why the last send failed, for the receiver's report
    Ring<Inflight> inflight_;  // capacity pipeline_depth: never reallocates
    // Receiver scratch (receiver thread only).
    uint64_t st_[kMaxRecvBatch] = {};
    uint64_t need_[kMaxRecvBatch] = {};
    struct iovec riov_[2 * kMaxRecvBatch] = {};
    std::vector<TransferItem> done_;
    std::thread sender_, receiver_;
};

TcpClient::Peer::Peer(std::string h, uint16_t p, const TcpClientOptions &o)
    : host(std::move(h)), port(p), label(join_host_port(host, p)), opt(o) {
    for (uint32_t i = 0; i < opt.lanes_per_peer; ++i) {
        lanes_.push_back(std::make_unique<Lane>(*this, static_cast<int>(i)));
        lanes_.back()->start();
    }
}

TcpClient::Peer::~Peer() { stop(); }

void TcpClient::Peer::enqueue(std::vector<TransferItem> &items, int version) {
    bool rejected = false;
    {
        std::lock_guard<std::mutex> g(mu_);
        if (!stopping_)
            for (auto &it : items) queue_.push_back(Queued{std::move(it), version});
        else
            rejected = true;
    }
    if (rejected) {
        for (auto &it : items) it.fail("the engine is shutting down");
        return;
    }
    cv_.notify_all();
}

bool TcpClient::Peer::pop_many(std::vector<Queued> &out, size_t max_items) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return false;
    uint64_t bytes = 0;
    while (!queue_.empty() && out.size() < max_items) {
        uint64_t len = queue_.front().item.length;
        if (!out.empty() && bytes + len > kCoalesceBytes) break;
        bytes += len;
        out.push_back(queue_.pop_front());
    }
    // Others may find work left.
    if (!queue_.empty()) cv_.notify_one();
    return true;
}

bool TcpClient::Peer::recent_connect_failure(std::string &why) {
    std::lock_guard<std::mutex> g(mu_);
    if (failure_.empty()) return false;
    if (Clock::now() - failed_at_ > std::chrono::seconds(1)) {
        failure_.clear();
        return false;
    }
    why = failure_;
    return true;
}

void TcpClient::Peer::note_connect_failure(const std::string &why) {
    std::lock_guard<std::mutex> g(mu_);
    failed_at_ = Clock::now();
    failure_ = why;
}

void TcpClient::Peer::stop() {
    std::vector<Queued> left;
    {
        std::lock_guard<std::mutex> g(mu_);
        if (stopping_ && lanes_.empty()) return;
        stopping_ = true;
        while (!queue_.empty()) left.push_back(queue_.pop_front());
    }
    cv_.notify_all();
    for (auto &q : left) q.item.fail("the engine is shutting down");
    for (auto &l : lanes_) l->stop();
    lanes_.clear();
}

bool Lane::connect_locked(std::unique_lock<std::mutex> &lk, std::string &why) {
    // Reconnect only once the receiver has failed or finished everything
    // that used the old connection.
    cv_.wait(lk, [this] { return stop_ || (inflight_.empty() && !receiver_busy_); });
    if (stop_) {
        why = "the engine is shutting down";
        return false;
    }
    fd_.reset();
    broken_ = false;
    send_error_.clear();
    if (peer_.recent_connect_failure(why)) return false;
    lk.unlock();
    int code = 0;
    std::string err;
    Fd nf = connect_tcp(peer_.host, peer_.port, static_cast<int>(peer_.opt.connect_timeout_ms),
                        code, err);
    if (nf.valid()) {
        int t = static_cast<int>(peer_.opt.progress_timeout_ms);
        set_io_timeouts(nf.get(), t, t);
    }
    lk.lock();
    if (!nf.valid()) {
        why = err;
        peer_.note_connect_failure(err);
        MC_LOG(Warn, "TCP lane " << index_ << ": " << err);
        return false;
    }
    if (stop_) {
        why = "the engine is shutting down";
        return false;
    }
    fd_ = std::move(nf);
    MC_LOG(Debug, "TCP lane " << index_ << " connected to " << peer_.label);
    return true;
}

void Lane::send_loop() {
    const size_t depth = peer_.opt.pipeline_depth;
    std::vector<Queued> run;
    run.reserve(depth);
    std::vector<struct iovec> iov;
    iov.reserve(kMaxSendIov + 2);
    std::vector<Inflight *> pending;  // entries whose bytes are in `iov`
    pending.reserve(depth);
    std::vector<Inflight *> entries;  // this run's entries
    entries.reserve(depth);
    // Headers of this run, owned by the sender: the receiver may hand an
    // entry back (its answer came) while sendmsg still holds the iovec list.
    std::vector<std::array<unsigned char, kTcpHeaderLen>> hdrs(depth);
    for (;;) {
        size_t space = 0;
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return stop_ || inflight_.size() < depth; });
            if (stop_) break;
            space = depth - inflight_.size();
        }
        run.clear();
        if (!peer_.pop_many(run, space)) break;

        int sock = -1;
        {
            std::unique_lock<std::mutex> lk(mu_);
            std::string why;
            // An idle lane that the server closed (its idle deadline) is
            // reconnected before use instead of failing the next request.
            if (fd_.valid() && !broken_ && inflight_.empty() && !receiver_busy_) {
                struct pollfd p = {fd_.get(), POLLIN | POLLRDHUP, 0};
                if (::poll(&p, 1, 0) > 0) broken_ = true;
            }
            if (stop_) why = "the engine is shutting down";
            else if ((broken_ || !fd_.valid()) && !connect_locked(lk, why)) {
                if (why.empty()) why = "cannot connect";
            }
            if (!why.empty()) {
                lk.unlock();
                for (auto &q : run) q.item.fail(describe(q.item, peer_.label) + " failed: " + why);
                continue;
            }
            entries.clear();
            for (auto &q : run) {
                inflight_.push_back(Inflight{std::move(q.item), q.version, false});
                entries.push_back(&inflight_.back());  // stable: the ring never grows
            }
            sending_ = true;
            sock = fd_.get();
        }
        cv_.notify_all();  // the receiver may be waiting for work

        // These entries are ours to send: the receiver only reads them once
        // they are marked sent, and they stay put in the ring.
        IoResult io;
        std::string gpu_err;
        auto flush = [&]() {
            if (!iov.empty()) io = sendv_all(sock, iov.data(), static_cast<int>(iov.size()));
            iov.clear();
            std::lock_guard<std::mutex> g(mu_);
            if (io.ok())
                for (Inflight *e : pending) e->sent = true;
            pending.clear();
            cv_.notify_all();
            return io.ok();
        };
        for (size_t i = 0; i < run.size() && io.ok(); ++i) {
            Inflight *e = entries[i];
            unsigned char *hdr = hdrs[i].data();
            TransferItem &it = e->item;
            const bool write = it.opcode == kTcpOpWrite;
            const int device = it.local_device();
            TcpHeader h;
            h.size = it.length;
            h.addr = it.remote_addr;
            if (device >= 0 && write) {
                // GPU source: what is gathered, then header and payload
                // staged chunk by chunk.
                if (!flush()) break;
                h.opcode = static_cast<uint8_t>(kTcpOpWrite | (e->version >= 2 ? kTcpV2Flag : 0));
                encode_tcp_header(h, hdr);
                io = send_all(sock, hdr, kTcpHeaderLen);
                if (io.ok())
                    io = gpu::send_from_device(sock, it.local, static_cast<size_t>(h.size), device, gpu_err);
                pending.push_back(e);
                if (!flush()) break;
                continue;
            } else {
                h.opcode = static_cast<uint8_t>((write ? kTcpOpWrite : kTcpOpRead) |
                                                (e->version >= 2 ? kTcpV2Flag : 0));
                encode_tcp_header(h, hdr);
                iov.push_back({hdr, kTcpHeaderLen});
                if (write) iov.push_back({it.local, static_cast<size_t>(h.size)});
            }
            pending.push_back(e);
            if (iov.size() >= kMaxSendIov && !flush()) break;
        }
        if (io.ok()) flush();

        std::lock_guard<std::mutex> g(mu_);
        sending_ = false;
        pending.clear();
        iov.clear();
        if (!io.ok()) {
            MC_LOG(Info, "TCP lane " << index_ << ": sending to " << peer_.label
                                     << " failed: " << (gpu_err.empty() ? io.describe() : gpu_err));
            send_error_ = gpu_err.empty() ? io.describe() : gpu_err;
            mark_broken_locked();
        }
        cv_.notify_all();
    }
}

bool Lane::read_one(int sock, Inflight &e, std::string &why) {
    const bool write = e.item.opcode == kTcpOpWrite;
    const int device = e.item.local_device();
    // READ data: straight into host memory, or staged into GPU memory.
    auto read_payload = [&]() {
        IoResult io;
        std::string err;
        if (device < 0) io = recv_all(sock, e.item.local, static_cast<size_t>(e.item.length));
        else io = gpu::recv_into_device(sock, e.item.local, static_cast<size_t>(e.item.length), device, err);
        if (!io.ok()) why = err.empty() ? io.describe() : err;
        return io.ok();
    };
    if (e.version < 2) return write || read_payload();  // v1 WRITE has no acknowledgement
    unsigned char st[8];
    IoResult io = recv_all(sock, st, sizeof st);
    if (!io.ok()) {
        why = io.describe();
        return false;
    }
    TcpStatus status = decode_tcp_status(st);
    if (!status.valid) {
        why = "malformed status frame from the peer";
        return false;
    }
    uint32_t code = status.code;
    if (code == kTcpStatusRejected) {
        why = "the peer rejected it: the range is not inside one registered, "
              "remote-accessible buffer of the target segment";
        return false;
    }
    if (code != kTcpStatusOk) {
        why = "the peer answered with unknown status " + std::to_string(code);
        return false;
    }
    return write || read_payload();
}

bool Lane::read_batch(std::unique_lock<std::mutex> &lk, size_t n, std::string &why) {
    // Answers of entries 0..n-1: a status frame each, then the data of
    // plain READs, gathered into one iovec list and read with as few readv
    // calls as the peer's sends allow.
    size_t niov = 0;
    for (size_t i = 0; i < n; ++i) {
        Inflight &e = inflight_.at(i);
        need_[i] = 8;
        riov_[niov++] = {&st_[i], 8};
        if (e.item.opcode != kTcpOpWrite) {
            riov_[niov++] = {e.item.local, static_cast<size_t>(e.item.length)};
            need_[i] += e.item.length;
        }
    }
    const int sock = fd_.get();
    lk.unlock();
    struct iovec *iov = riov_;
    int cnt = static_cast<int>(niov);
    size_t next = 0;    // first entry whose answer is not complete
    uint64_t have = 0;  // bytes of it received so far
    size_t popped = 0;  // entries handed back already
    bool ok = true;
    auto hand_back = [&]() {
        if (next == popped) return;
        done_.clear();
        lk.lock();
        for (size_t i = popped; i < next; ++i) done_.push_back(inflight_.pop_front().item);
        cv_.notify_all();  // pipeline space for the sender
        lk.unlock();
        for (size_t i = popped; i < next; ++i) {
            done_[i - popped].complete();
        }
        popped = next;
    };
    while (next < n) {
        ssize_t r = ::readv(sock, iov, cnt);
        if (r < 0) {
            if (errno == EINTR) continue;
            why = errno == EAGAIN || errno == EWOULDBLOCK ? "timed out with no progress"
                                                          : errno_string(errno);
            ok = false;
            break;
        }
        if (r == 0) {
            why = "connection closed by peer";
            ok = false;
            break;
        }
        size_t left = static_cast<size_t>(r);
        // Move the iovec cursor past what arrived.
        for (size_t m = left; cnt > 0 && m > 0;) {
            size_t take = m < iov->iov_len ? m : iov->iov_len;
            iov->iov_base = static_cast<char *>(iov->iov_base) + take;
            iov->iov_len -= take;
            m -= take;
            if (iov->iov_len == 0) {
                ++iov;
                --cnt;
            }
        }
        // Account the bytes to entries, checking each status frame as soon
        // as it is complete.
        while (left > 0 && next < n) {
            uint64_t take = need_[next] - have < left ? need_[next] - have : left;
            bool status_was_partial = have < 8;
            have += take;
            left -= static_cast<size_t>(take);
            if (status_was_partial && have >= 8) {
                TcpStatus status =
                    decode_tcp_status(reinterpret_cast<const unsigned char *>(&st_[next]));
                uint32_t code = status.code;
                if (!status.valid) {
                    why = "malformed status frame from the peer";
                    ok = false;
                } else if (code == kTcpStatusRejected) {
                    why = "the peer rejected it: the range is not inside one registered, "
                          "remote-accessible buffer of the target segment";
                    ok = false;
                } else if (code != kTcpStatusOk) {
                    why = "the peer answered with unknown status " + std::to_string(code);
                    ok = false;
                }
                if (!ok) break;
            }
            if (have == need_[next]) {
                ++next;
                have = 0;
            }
        }
        if (!ok) break;
        hand_back();
    }
    hand_back();
    lk.lock();
    return ok;
}

void Lane::fail_all_locked(std::unique_lock<std::mutex> &lk, std::string why) {
    if (stop_) why = "the engine is shutting down";
    if (why.empty() && !send_error_.empty()) why = "sending failed: " + send_error_;
    if (why.empty()) why = "the connection broke";
    mark_broken_locked();
    cv_.wait(lk, [this] { return !sending_; });
    if (!inflight_.empty()) {
        const std::string first = describe(inflight_.front().item, peer_.label) + " failed: " + why;
        MC_LOG(Info, "TCP lane " << index_ << ": " << first);
        bool head = true;
        while (!inflight_.empty()) {
            TransferItem item = inflight_.pop_front().item;
            item.fail(head ? first
                           : describe(item, peer_.label) +
                                 " failed: an earlier request on its connection failed (" + why +
                                 ")");
            head = false;
        }
    }
    receiver_busy_ = false;
    cv_.notify_all();
}

void Lane::receive_loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        cv_.wait(lk, [this] { return stop_ || !inflight_.empty(); });
        if (inflight_.empty()) break;  // stopping and nothing left
        receiver_busy_ = true;
        Inflight &e = inflight_.front();
        // A WRITE's acknowledgement counts only after its payload is out;
        // the progress clock starts here.
        cv_.wait(lk, [&] { return e.sent || broken_ || !needs_sent(e); });
        if (broken_) {
            fail_all_locked(lk, std::string());
            continue;
        }
        size_t n = 0;
        while (n < inflight_.size() && n < kMaxRecvBatch) {
            Inflight &x = inflight_.at(n);
            if ((!x.sent && needs_sent(x)) || x.version < 2 || x.item.local_device() >= 0) break;
            ++n;
        }
        std::string why;
        if (n > 0) {
            if (read_batch(lk, n, why)) {
                receiver_busy_ = false;
                cv_.notify_all();
                continue;
            }
        } else {
            // GPU memory or legacy framing: one request at a time.
            int sock = fd_.get();
            lk.unlock();
            bool ok = read_one(sock, e, why);
            lk.lock();
            if (ok) {
                TransferItem item = inflight_.pop_front().item;
                receiver_busy_ = false;
                cv_.notify_all();
                lk.unlock();
                item.complete();
                lk.lock();
                continue;
            }
        }
        fail_all_locked(lk, why);
    }
}

TcpClient::TcpClient(TcpClientOptions opt) : opt_(opt) {}

TcpClient::~TcpClient() { stop(); }

void TcpClient::submit(const std::string &host, uint16_t port, int proto_version,
                       std::vector<TransferItem> &items) {
    std::shared_ptr<Peer> peer;
    {
        std::lock_guard<std::mutex> g(mu_);
        if (stopped_) {
            for (auto &it : items) it.fail("the engine is shutting down");
            return;
        }
        for (auto &p : peers_)
            if (p->port == port && p->host == host) {
                peer = p;
                break;
            }
        if (!peer) {
            peer = std::make_shared<Peer>(host, port, opt_);
            peers_.push_back(peer);
        }
    }
    submitted_.fetch_add(items.size(), std::memory_order_relaxed);
    peer->enqueue(items, proto_version);
}

void TcpClient::stop() {
    std::vector<std::shared_ptr<Peer>> peers;
    {
        std::lock_guard<std::mutex> g(mu_);
        stopped_ = true;
        peers.swap(peers_);
    }
    for (auto &p : peers) p->stop();
}

}  // namespace mcrs
