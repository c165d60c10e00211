#include "transport/tcp/tcp_client.h"

#include <sys/socket.h>

#include <sstream>

#include "common/error.h"
#include "common/host_port.h"
#include "common/log.h"
#include "gpu/gpu.h"
#include "transport/tcp/tcp_wire.h"

namespace mcrs {

namespace {

using Clock = std::chrono::steady_clock;

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
    // Blocks until an item is available; false once the peer is stopping.
    bool pop(Queued &out);
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
    std::deque<Queued> queue_;
    bool stopping_ = false;
    Clock::time_point failed_at_{};
    std::string failure_;
    std::vector<std::unique_ptr<Lane>> lanes_;
};

// One persistent connection with a sender and a receiver thread.
class Lane {
public:
    Lane(TcpClient::Peer &peer, int index) : peer_(peer), index_(index) {}
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

    void mark_broken_locked() {
        broken_ = true;
        if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
    }

    bool connect_locked(std::unique_lock<std::mutex> &lk, std::string &why);
    void send_loop();
    void receive_loop();
    bool read_response(int sock, Inflight &e, std::string &why);

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
    std::deque<Inflight> inflight_;
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
    std::vector<TransferItem> rejected;
    {
        std::lock_guard<std::mutex> g(mu_);
        for (auto &it : items) {
            if (stopping_) {
                rejected.push_back(std::move(it));
                continue;
            }
            queue_.push_back(Queued{std::move(it), version});
        }
    }
    cv_.notify_all();
    for (auto &it : rejected) it.fail("the engine is shutting down");
}

bool TcpClient::Peer::pop(Queued &out) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return false;
    out = std::move(queue_.front());
    queue_.pop_front();
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
    std::deque<Queued> left;
    {
        std::lock_guard<std::mutex> g(mu_);
        if (stopping_ && lanes_.empty()) return;
        stopping_ = true;
        left.swap(queue_);
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
    int t = static_cast<int>(peer_.opt.progress_timeout_ms);
    set_io_timeouts(nf.get(), t, t);
    fd_ = std::move(nf);
    MC_LOG(Debug, "TCP lane " << index_ << " connected to " << peer_.label);
    return true;
}

void Lane::send_loop() {
    Queued q;
    while (peer_.pop(q)) {
        Inflight *e = nullptr;
        int sock = -1;
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [this] {
                return stop_ || inflight_.size() < peer_.opt.pipeline_depth;
            });
            std::string why;
            if (stop_) {
                lk.unlock();
                q.item.fail("the engine is shutting down");
                continue;
            }
            if ((broken_ || !fd_.valid()) && !connect_locked(lk, why)) {
                lk.unlock();
                q.item.fail(describe(q.item, peer_.label) + " failed: " + why);
                continue;
            }
            inflight_.push_back(Inflight{std::move(q.item), q.version, false});
            e = &inflight_.back();
            sending_ = true;
            sock = fd_.get();
        }
        cv_.notify_all();  // the receiver may be waiting for work

        unsigned char hdr[kTcpHeaderLen];
        TcpHeader h;
        h.size = e->item.length;
        h.addr = e->item.remote_addr;
        h.opcode = static_cast<uint8_t>(e->item.opcode == kTcpOpWrite ? kTcpOpWrite : kTcpOpRead);
        if (e->version >= 2) h.opcode |= kTcpV2Flag;
        encode_tcp_header(h, hdr);
        const int device = e->item.local_device();
        IoResult io;
        std::string gpu_err;
        if (device >= 0 && e->item.opcode == kTcpOpWrite) {
            // GPU source: header, then the payload staged chunk by chunk.
            io = send_all(sock, hdr, sizeof hdr);
            if (io.ok()) io = gpu::send_from_device(sock, e->item.local, static_cast<size_t>(h.size), device, gpu_err);
        } else {
            struct iovec iov[2];
            int n = 0;
            iov[n++] = {hdr, sizeof hdr};
            if (e->item.opcode == kTcpOpWrite) iov[n++] = {e->item.local, static_cast<size_t>(h.size)};
            io = sendv_all(sock, iov, n);
        }

        std::lock_guard<std::mutex> g(mu_);
        sending_ = false;
        if (io.ok()) {
            e->sent = true;
        } else {
            MC_LOG(Info, "TCP lane " << index_ << ": sending " << describe(e->item, peer_.label)
                                     << " failed: " << io.describe());
            send_error_ = gpu_err.empty() ? io.describe() : gpu_err;
            mark_broken_locked();
        }
        cv_.notify_all();
    }
}

bool Lane::read_response(int sock, Inflight &e, std::string &why) {
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
    struct iovec iov[2];
    int n = 0;
    iov[n++] = {st, sizeof st};
    // Host READs take the status frame and the data in one readv.
    const bool fused = !write && device < 0;
    if (fused) iov[n++] = {e.item.local, static_cast<size_t>(e.item.length)};
    IoResult io = recvv_all(sock, iov, n);
    if (io.done >= sizeof st || io.ok()) {
        uint64_t v = get_le64(st);
        if (static_cast<uint32_t>(v >> 32) != kTcpStatusMagic) {
            why = "malformed status frame from the peer";
            return false;
        }
        uint32_t code = static_cast<uint32_t>(v);
        if (code == kTcpStatusRejected) {
            why = "the peer rejected it: the range is not inside one registered, "
                  "remote-accessible buffer of the target segment";
            return false;
        }
        if (code != kTcpStatusOk) {
            why = "the peer answered with unknown status " + std::to_string(code);
            return false;
        }
    }
    if (!io.ok()) {
        why = io.describe();
        return false;
    }
    return write || fused || read_payload();
}

void Lane::receive_loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        cv_.wait(lk, [this] { return stop_ || !inflight_.empty(); });
        if (inflight_.empty()) break;  // stopping and nothing left
        Inflight &e = inflight_.front();
        receiver_busy_ = true;
        // A WRITE's acknowledgement can only come after its payload is out;
        // start the progress clock from there.
        if (e.item.opcode == kTcpOpWrite)
            cv_.wait(lk, [&] { return e.sent || broken_; });
        std::string why;
        bool ok = false;
        if (!broken_) {
            int sock = fd_.get();
            lk.unlock();
            ok = read_response(sock, e, why);
            lk.lock();
            if (ok) cv_.wait(lk, [&] { return e.sent || broken_; });
            ok = ok && e.sent;
        }
        if (ok) {
            TransferItem item = std::move(e.item);
            inflight_.pop_front();
            receiver_busy_ = false;
            cv_.notify_all();
            item.complete();
            continue;
        }
        if (stop_) why = "the engine is shutting down";
        if (why.empty() && !send_error_.empty()) why = "sending failed: " + send_error_;
        if (why.empty()) why = stop_ ? "the engine is shutting down" : "the connection broke";
        const std::string first = describe(e.item, peer_.label) + " failed: " + why;
        MC_LOG(Info, "TCP lane " << index_ << ": " << first);
        mark_broken_locked();
        cv_.wait(lk, [this] { return !sending_; });
        bool head = true;
        while (!inflight_.empty()) {
            TransferItem item = std::move(inflight_.front().item);
            inflight_.pop_front();
            item.fail(head ? first
                           : describe(item, peer_.label) +
                                 " failed: an earlier request on its connection failed (" + why +
                                 ")");
            head = false;
        }
        receiver_busy_ = false;
        cv_.notify_all();
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
        std::string key = join_host_port(host, port);
        auto &slot = peers_[key];
        if (!slot) slot = std::make_shared<Peer>(host, port, opt_);
        peer = slot;
    }
    submitted_.fetch_add(items.size(), std::memory_order_relaxed);
    peer->enqueue(items, proto_version);
}

void TcpClient::stop() {
    std::map<std::string, std::shared_ptr<Peer>> peers;
    {
        std::lock_guard<std::mutex> g(mu_);
        stopped_ = true;
        peers.swap(peers_);
    }
    for (auto &kv : peers) kv.second->stop();
}

}  // namespace mcrs
