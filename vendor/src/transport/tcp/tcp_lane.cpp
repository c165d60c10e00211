#include "transport/tcp/tcp_lane.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "common/log.h"
#include "gpu/gpu.h"

namespace mcrs {

namespace tcp {

namespace {

std::string describe(const TransferItem &it, const std::string &peer) {
    std::ostringstream s;
    s << (it.opcode == kTcpOpWrite ? "WRITE" : "READ") << " of " << it.length
      << " bytes at remote 0x" << std::hex << it.remote_addr << std::dec << " on " << peer;
    return s.str();
}

// Moves the iovec cursor past `m` bytes that arrived.
inline void advance_iov(struct iovec *&iov, int &cnt, size_t m) {
    while (cnt > 0 && m > 0) {
        size_t take = m < iov->iov_len ? m : iov->iov_len;
        iov->iov_base = static_cast<char *>(iov->iov_base) + take;
        iov->iov_len -= take;
        m -= take;
        if (iov->iov_len == 0) {
            ++iov;
            --cnt;
        }
    }
}

// Checks an 8-byte v2 status frame; false with `why` unless it says OK
// (`rejected` tells a REJECTED from a broken frame).
inline bool status_ok(const unsigned char *st, std::string &why, bool &rejected) {
    TcpStatus status = decode_tcp_status(st);
    uint32_t code = status.code;
    if (!status.valid) {
        why = "malformed status frame from the peer";
        return false;
    }
    if (code == kTcpStatusRejected) {
        rejected = true;
        why = "the peer rejected it: the range is not inside one registered, "
              "remote-accessible buffer of the target segment";
        return false;
    }
    if (code != kTcpStatusOk) {
        why = "the peer answered with unknown status " + std::to_string(code);
        return false;
    }
    return true;
}

}  // namespace

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
    SendBuffers b(depth);
    for (;;) {
        size_t space = 0;
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return stop_ || inflight_.size() < depth; });
            if (stop_) break;
            space = depth - inflight_.size();
        }
        b.run.clear();
        if (!peer_.pop_many(b.run, space)) break;
        const int sock = admit_run(b);
        if (sock < 0) continue;  // the run failed: no connection
        cv_.notify_all();        // the receiver may be waiting for work

        // These entries are ours to send: the receiver only reads them once
        // they are marked sent, and they stay put in the ring.
        std::string gpu_err;
        IoResult io = send_run(sock, b, gpu_err);
        finish_run(b, io, gpu_err);
    }
}

int Lane::admit_run(SendBuffers &b) {
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
        for (auto &q : b.run) q.item.fail(describe(q.item, peer_.label) + " failed: " + why);
        return -1;
    }
    b.entries.clear();
    for (auto &q : b.run) {
        inflight_.push_back(Inflight{std::move(q.item), q.version, false});
        b.entries.push_back(&inflight_.back());  // stable: the ring never grows
    }
    sending_ = true;
    return fd_.get();
}

IoResult Lane::send_run(int sock, SendBuffers &b, std::string &gpu_err) {
    IoResult io;
    for (size_t i = 0; i < b.run.size() && io.ok(); ++i) {
        Inflight *e = b.entries[i];
        unsigned char *hdr = b.hdrs[i].data();
        TransferItem &it = e->item;
        const bool write = it.opcode == kTcpOpWrite;
        if (it.local_device() >= 0 && write) {
            if (stageable_write(b, i)) {
                if (!flush_sends(sock, b, io)) break;
                i = send_staged_writes(sock, b, i, io, gpu_err) - 1;
                continue;
            }
            if (!send_gpu_write(sock, b, *e, hdr, io, gpu_err)) break;
            continue;
        }
        TcpHeader h;
        h.size = it.length;
        h.addr = it.remote_addr;
        h.opcode = static_cast<uint8_t>((write ? kTcpOpWrite : kTcpOpRead) |
                                        (e->version >= 2 ? kTcpV2Flag : 0));
        encode_tcp_header(h, hdr);
        b.iov.push_back({hdr, kTcpHeaderLen});
        if (write) b.iov.push_back({it.local, static_cast<size_t>(h.size)});
        b.pending.push_back(e);
        if (b.iov.size() >= kMaxSendIov && !flush_sends(sock, b, io)) break;
    }
    if (io.ok()) flush_sends(sock, b, io);
    return io;
}

bool Lane::flush_sends(int sock, SendBuffers &b, IoResult &io) {
    if (!b.iov.empty()) io = sendv_all(sock, b.iov.data(), static_cast<int>(b.iov.size()));
    b.iov.clear();
    std::lock_guard<std::mutex> g(mu_);
    if (io.ok())
        for (Inflight *e : b.pending) e->sent = true;
    b.pending.clear();
    cv_.notify_all();
    return io.ok();
}

bool Lane::send_gpu_write(int sock, SendBuffers &b, Inflight &e, unsigned char *hdr, IoResult &io,
                          std::string &gpu_err) {
    // GPU source: what is gathered, then header and payload
    // staged chunk by chunk.
    if (!flush_sends(sock, b, io)) return false;
    TcpHeader h;
    h.size = e.item.length;
    h.addr = e.item.remote_addr;
    h.opcode = static_cast<uint8_t>(kTcpOpWrite | (e.version >= 2 ? kTcpV2Flag : 0));
    encode_tcp_header(h, hdr);
    io = send_all(sock, hdr, kTcpHeaderLen);
    if (io.ok())
        io = gpu::send_from_device(sock, e.item.local, static_cast<size_t>(h.size),
                                   e.item.local_device(), gpu_err);
    b.pending.push_back(&e);
    return flush_sends(sock, b, io);
}

bool Lane::stageable_write(const SendBuffers &b, size_t i) {
    const TransferItem &it = b.entries[i]->item;
    if (it.opcode != kTcpOpWrite || it.local_device() < 0 || it.length > gpu::StageRing::kMaxPiece) return false;
    std::string why;
    if (send_stage_.ready(it.local_device(), why)) return true;
    MC_LOG(Debug, "TCP lane " << index_ << ": GPU WRITE not batched: " << why);
    return false;
}

namespace {
constexpr size_t kSendGroup = 256 << 10;
static_assert(kSendGroup <= gpu::StageRing::kHalfBytes && gpu::StageRing::kMaxPiece <= gpu::StageRing::kHalfBytes,
              "a group, and any one staged piece, fit a half");
}  // namespace

size_t Lane::send_staged_writes(int sock, SendBuffers &b, size_t i, IoResult &io, std::string &gpu_err) {
    const int device = b.entries[i]->item.local_device();
    int h = 0, prev = -1;  // the half being filled, the one waiting to go out
    size_t used = 0;
    // On any failure, no copy may still read the caller's GPU memory once
    // its request is failed: wait for both halves.
    auto settle = [&] {
        std::string ignored;
        send_stage_.wait(0, ignored);
        send_stage_.wait(1, ignored);
        return i;
    };
    auto fail_gpu = [&] {
        io.status = IoStatus::Error;
        io.err = EIO;
        return settle();
    };
    for (int k = 0; k < 2; ++k) {
        b.staged_iov[k].clear();
        b.staged[k].clear();
    }
    for (; i < b.run.size(); ++i) {
        Inflight *e = b.entries[i];
        const TransferItem &it = e->item;
        // Groups of kSendGroup bytes (a run is at most about 1 MiB, so a run
        // has several and the copy of one overlaps the send of the previous);
        // a larger piece is a group of its own.
        const bool fits = (used == 0 || used + it.length <= kSendGroup) && b.staged_iov[h].size() + 2 <= kMaxSendIov;
        const bool last = !(it.local_device() == device && it.opcode == kTcpOpWrite &&
                            it.length <= gpu::StageRing::kMaxPiece);
        if (!fits || last) {
            // Half h is complete: start its copy, then send the half before it
            // while the copy engine works.
            if (!send_stage_.issue(h, gpu_err)) return fail_gpu();
            if (prev >= 0 && !send_staged_half(sock, b, prev, io, gpu_err)) return settle();
            prev = h;
            h ^= 1;
            used = 0;
            if (last) break;
        }
        char *slot = send_stage_.half(h) + used;
        send_stage_.queue(slot, it.local, it.length);
        used += it.length;
        TcpHeader hd;
        hd.size = it.length;
        hd.addr = it.remote_addr;
        hd.opcode = static_cast<uint8_t>(kTcpOpWrite | (e->version >= 2 ? kTcpV2Flag : 0));
        unsigned char *hdr = b.hdrs[i].data();
        encode_tcp_header(hd, hdr);
        b.staged_iov[h].push_back({hdr, kTcpHeaderLen});
        b.staged_iov[h].push_back({slot, static_cast<size_t>(it.length)});
        b.staged[h].push_back(e);
    }
    if (i == b.run.size() && !b.staged[h].empty()) {
        if (!send_stage_.issue(h, gpu_err)) return fail_gpu();
        if (prev >= 0 && !send_staged_half(sock, b, prev, io, gpu_err)) return settle();
        prev = h;
    }
    if (prev >= 0 && !send_staged_half(sock, b, prev, io, gpu_err)) return settle();
    return i;
}

bool Lane::send_staged_half(int sock, SendBuffers &b, int h, IoResult &io, std::string &gpu_err) {
    if (!send_stage_.wait(h, gpu_err)) {
        io.status = IoStatus::Error;
        io.err = EIO;
        return false;
    }
    // The half goes out through the common path, which marks its entries sent.
    for (const auto &v : b.staged_iov[h]) b.iov.push_back(v);
    for (Inflight *e : b.staged[h]) b.pending.push_back(e);
    b.staged_iov[h].clear();
    b.staged[h].clear();
    // At most kMaxSendIov pieces (send_staged_writes starts a new half
    // there), and b.iov was empty: one sendmsg list, under IOV_MAX.
    return flush_sends(sock, b, io);
}

void Lane::finish_run(SendBuffers &b, const IoResult &io, const std::string &gpu_err) {
    std::lock_guard<std::mutex> g(mu_);
    sending_ = false;
    b.pending.clear();
    b.iov.clear();
    if (!io.ok()) {
        MC_LOG(Info, "TCP lane " << index_ << ": sending to " << peer_.label
                                 << " failed: " << (gpu_err.empty() ? io.describe() : gpu_err));
        send_error_ = gpu_err.empty() ? io.describe() : gpu_err;
        mark_broken_locked();
    }
    cv_.notify_all();
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
    if (!status_ok(st, why, head_rejected_)) return false;
    return write || read_payload();
}

bool Lane::read_batch(std::unique_lock<std::mutex> &lk, size_t n, std::string &why) {
    const int cnt0 = static_cast<int>(gather_answers(n));
    const int sock = fd_.get();
    lk.unlock();
    struct iovec *iov = riov_;
    int cnt = cnt0;
    size_t next = 0;    // first entry whose answer is not complete
    uint64_t have = 0;  // bytes of it received so far
    size_t popped = 0;  // entries handed back already
    bool ok = true;
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
        const size_t got = static_cast<size_t>(r);
        advance_iov(iov, cnt, got);
        if (!account_answers(got, n, next, have, why)) {
            ok = false;
            break;
        }
        // Entries with staged bytes complete once those reach the device.
        if (staged_ == 0) hand_back(lk, popped, next);
    }
    if (staged_ != 0) {
        // Only what arrived in full goes to the device (the batch's prefix).
        if (!unstage(popped, next, why)) {
            ok = false;
            head_rejected_ = false;  // the head is now a request whose copy failed
            next = popped;
        }
    }
    hand_back(lk, popped, next);
    lk.lock();
    return ok;
}

size_t Lane::gather_answers(size_t n) {
    // Answers of entries 0..n-1: a status frame each, then the data of
    // plain READs, gathered into one iovec list and read with as few readv
    // calls as the peer's sends allow.
    size_t niov = 0;
    staged_ = 0;
    for (size_t i = 0; i < n; ++i) {
        Inflight &e = inflight_.at(i);
        need_[i] = 8;
        sdst_[i] = nullptr;
        riov_[niov++] = {&st_[i], 8};
        if (e.item.opcode != kTcpOpWrite) {
            void *into = e.item.local;
            if (e.item.local_device() >= 0) {  // a staging slot; copied after the batch
                into = recv_stage_.half(0) + staged_;
                sdst_[i] = e.item.local;
                staged_ += e.item.length;
            }
            riov_[niov++] = {into, static_cast<size_t>(e.item.length)};
            need_[i] += e.item.length;
        }
    }
    return niov;
}

bool Lane::account_answers(size_t left, size_t n, size_t &next, uint64_t &have, std::string &why) {
    // Account the bytes to entries, checking each status frame as soon
    // as it is complete.
    while (left > 0 && next < n) {
        uint64_t take = need_[next] - have < left ? need_[next] - have : left;
        bool status_was_partial = have < 8;
        have += take;
        left -= static_cast<size_t>(take);
        if (status_was_partial && have >= 8 &&
            !status_ok(reinterpret_cast<const unsigned char *>(&st_[next]), why, head_rejected_))
            return false;
        if (have == need_[next]) {
            ++next;
            have = 0;
        }
    }
    return true;
}

bool Lane::stage_ready(int device) {
    std::string why;
    if (recv_stage_.ready(device, why)) return true;
    MC_LOG(Debug, "TCP lane " << index_ << ": GPU READ not batched: " << why);
    return false;
}

bool Lane::unstage(size_t from, size_t to, std::string &why) {
    // The staged READ data of entries [from, to), in slot order, to their
    // device buffers: one batched copy and one wait.
    // (From what gather_answers noted: the ring is not touched unlocked.)
    size_t off = 0;
    for (size_t i = 0; i < to; ++i) {
        if (!sdst_[i]) continue;
        const size_t len = static_cast<size_t>(need_[i] - 8);
        if (i >= from) recv_stage_.queue(sdst_[i], recv_stage_.half(0) + off, len);
        off += len;
    }
    std::string err;
    if (recv_stage_.issue(0, err) && recv_stage_.wait(0, err)) return true;
    why = err;
    return false;
}

void Lane::hand_back(std::unique_lock<std::mutex> &lk, size_t &popped, size_t next) {
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
}

void Lane::fail_all_locked(std::unique_lock<std::mutex> &lk, std::string why) {
    // A REJECTED head ends the connection, and the target serves nothing
    // after it: the requests behind it go out again on another connection
    // instead of failing for a neighbour's bad range.
    const bool resend_rest = head_rejected_ && !stop_;
    head_rejected_ = false;
    if (stop_) why = "the engine is shutting down";
    if (why.empty() && !send_error_.empty()) why = "sending failed: " + send_error_;
    if (why.empty()) why = "the connection broke";
    mark_broken_locked();
    cv_.wait(lk, [this] { return !sending_; });
    if (resend_rest && !inflight_.empty()) {
        TransferItem head = inflight_.pop_front().item;
        resend_.clear();
        while (!inflight_.empty()) {
            Inflight e = inflight_.pop_front();
            resend_.push_back(tcp::Queued{std::move(e.item), e.version});
        }
        receiver_busy_ = false;
        cv_.notify_all();
        lk.unlock();
        MC_LOG(Info, "TCP lane " << index_ << ": " << describe(head, peer_.label) << " failed: " << why
                                 << (resend_.empty() ? std::string()
                                                     : "; sending the " + std::to_string(resend_.size()) +
                                                           " request(s) behind it again"));
        head.fail(describe(head, peer_.label) + " failed: " + why);
        if (!resend_.empty()) peer_.requeue_front(resend_);
        resend_.clear();
        lk.lock();
        return;
    }
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
        size_t n = 0, staged = 0;
        while (n < inflight_.size() && n < kMaxRecvBatch) {
            Inflight &x = inflight_.at(n);
            if ((!x.sent && needs_sent(x)) || x.version < 2) break;
            // GPU memory: small READs land in the staging ring (up to one
            // half per batch) and go to the device in one batched copy.
            if (x.item.local_device() >= 0 &&
                !(x.item.opcode != kTcpOpWrite && staged + x.item.length <= gpu::StageRing::kHalfBytes &&
                  x.item.length <= gpu::StageRing::kMaxPiece && stage_ready(x.item.local_device())))
                break;
            if (x.item.local_device() >= 0) staged += x.item.length;
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

}  // namespace tcp

}  // namespace mcrs
