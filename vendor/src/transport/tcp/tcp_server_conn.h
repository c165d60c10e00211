// The TCP server's per-connection state (TcpServer::Conn): the read-ahead
// of request headers and small WRITE payloads, and the answers gathered but
// not sent yet. Private to transport/tcp; everything is inline so that the
// server's request loop calls it without a call per request.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/log.h"
#include "common/socket.h"
#include "core/memory_registry.h"
#include "gpu/gpu.h"
#include "transport/tcp/tcp_server.h"
#include "transport/tcp/tcp_wire.h"

namespace mcrs {

// One connection's state: read-ahead of request headers and the answers
// gathered but not sent yet (with the pins of the memory they point to).
class TcpServer::Conn {
public:
    static constexpr size_t kInBuf = 65536;  // request headers read ahead
    // WRITE payloads up to this size come through the read-ahead buffer (one
    // recv brings many small requests, at the price of one memcpy each);
    // larger ones go straight from the socket into memory.
    static constexpr size_t kSmallPayload = 16384;
    static constexpr size_t kMaxOutIov = 512;                // gathered answer pieces
    static constexpr size_t kMaxOutBytes = size_t(4) << 20;  // flushed at this size
    // While other workers are idle, a worker waits this long for a connection's
    // next request before handing it back to the loop: a peer that sends runs
    // of requests then costs no thread hand-off per run. A connection that gets
    // ready meanwhile goes to an idle worker, so lingering delays nobody.
    static constexpr int kLingerMs = 10;

    enum class Got { Ok, Eof, WouldBlock, Woken, Error };

    Conn(int fd, int wake_fd, const std::atomic<size_t> &queued, const std::atomic<size_t> &idle)
        : fd_(fd), wake_fd_(wake_fd), queued_(queued), idle_(idle) {
        pins_.reserve(kMaxOutIov);
    }

    int fd() const { return fd_; }
    size_t buffered() const { return end_ - beg_; }
    const unsigned char *head() const { return in_ + beg_; }
    void consume(size_t n) {
        beg_ += n;
        if (beg_ == end_) beg_ = end_ = 0;
    }
    int last_errno() const { return err_; }
    // The loop saw the socket readable.
    void mark_readable() { drained_ = false; }

    // Makes at least `need` bytes available in the read-ahead buffer
    // (need <= kInBuf). Sends the gathered answers before it would wait:
    // when the last read found the socket drained, answer first, then
    // linger briefly (only while another worker is idle),
    // else report WouldBlock so that the loop waits instead. A pipelining
    // peer gets many answers per sendmsg.
    Got fill(size_t need) {
        while (end_ - beg_ < need) {
            if (kInBuf - beg_ < need || end_ == kInBuf) {
                std::memmove(in_, in_ + beg_, end_ - beg_);
                end_ -= beg_;
                beg_ = 0;
            }
            if (drained_) {
                if (!flush()) return Got::Error;
                if (idle_.load(std::memory_order_relaxed) <= queued_.load(std::memory_order_relaxed))
                    return Got::WouldBlock;
                int r = wait_readable(fd_, wake_fd_, kLingerMs);
                if (r == 0) return Got::WouldBlock;
                if (r < 0) return Got::Woken;
                drained_ = false;
            }
            // After a WRITE, read just the header: when the next request is
            // a WRITE too (a peer sending one at a time), its payload then
            // goes straight into memory instead of through this buffer.
            size_t space = after_write_ && !small_write_ ? need - (end_ - beg_) : kInBuf - end_;
            ssize_t n = ::recv(fd_, in_ + end_, space, MSG_DONTWAIT);
            if (n > 0) {
                end_ += static_cast<size_t>(n);
                drained_ = static_cast<size_t>(n) < space;
                continue;
            }
            if (n == 0) return Got::Eof;
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                err_ = errno;
                return Got::Error;
            }
            drained_ = true;
        }
        return Got::Ok;
    }

    // Receives `n` payload bytes into `mem`: what was read ahead first,
    // then straight from the socket, together with the next header when it
    // is already there.
    IoResult read_payload(char *mem, size_t n) {
        if (n <= kSmallPayload) return read_small_payload(mem, n);
        size_t done = buffered() < n ? buffered() : n;
        std::memcpy(mem, head(), done);
        consume(done);
        bool tried_nonblocking = false;
        while (done < n) {
            // The read-ahead buffer is empty here: the next header may share
            // this read (never more than a header, so no payload is copied
            // twice).
            struct iovec iov[2] = {{mem + done, n - done}, {in_ + end_, kTcpHeaderLen}};
            struct msghdr msg;
            std::memset(&msg, 0, sizeof msg);
            msg.msg_iov = iov;
            msg.msg_iovlen = 2;
            ssize_t got = ::recvmsg(fd_, &msg, tried_nonblocking ? 0 : MSG_DONTWAIT);
            if (got < 0) {
                if (errno == EINTR) continue;
                if ((errno == EAGAIN || errno == EWOULDBLOCK) && !tried_nonblocking) {
                    // Would block: answer what is gathered, then wait.
                    tried_nonblocking = true;
                    if (!flush()) return failed(err_ ? err_ : EPIPE, done);
                    continue;
                }
                return io_error(errno, done);
            }
            if (got == 0) return io_eof(done);
            size_t g = static_cast<size_t>(got);
            size_t to_mem = g < n - done ? g : n - done;
            done += to_mem;
            end_ += g - to_mem;
            // Short of the next header: the socket had no more for now.
            drained_ = g - to_mem < kTcpHeaderLen;
            tried_nonblocking = false;
        }
        IoResult r;
        r.done = done;
        return r;
    }

    // A small payload: read ahead as much as the socket has (the requests
    // that follow, with their payloads, usually), then copy it out.
    IoResult read_small_payload(char *mem, size_t n) {
        bool tried_nonblocking = false;
        while (buffered() < n) {
            if (kInBuf - beg_ < n || end_ == kInBuf) {
                std::memmove(in_, in_ + beg_, end_ - beg_);
                end_ -= beg_;
                beg_ = 0;
            }
            const size_t space = kInBuf - end_;
            ssize_t got = ::recv(fd_, in_ + end_, space, tried_nonblocking ? 0 : MSG_DONTWAIT);
            if (got < 0) {
                if (errno == EINTR) continue;
                if ((errno == EAGAIN || errno == EWOULDBLOCK) && !tried_nonblocking) {
                    // Would block: answer what is gathered, then wait.
                    tried_nonblocking = true;
                    if (!flush()) return failed(err_ ? err_ : EPIPE, 0);
                    continue;
                }
                return io_error(errno, 0);
            }
            if (got == 0) return io_eof(0);
            end_ += static_cast<size_t>(got);
            drained_ = static_cast<size_t>(got) < space;
            tried_nonblocking = false;
        }
        std::memcpy(mem, head(), n);
        consume(n);
        IoResult r;
        r.done = n;
        return r;
    }

    bool room(size_t pieces, size_t bytes) const {
        return nout_ + pieces <= kMaxOutIov && out_bytes_ + bytes <= kMaxOutBytes;
    }
    // Queues a status frame (v2) for sending.
    bool add_status(uint32_t code) {
        if (!room(1, 8) && !flush()) return false;
        // Each gathered piece has its own status slot.
        unsigned char *slot = reinterpret_cast<unsigned char *>(&st_[nout_]);
        put_le64(slot, encode_tcp_status(code));
        out_[nout_] = {slot, 8};
        ++nout_;
        out_bytes_ += 8;
        return true;
    }
    // Queues bytes of memory that stays valid while `pin` is held.
    bool add_data(const void *p, size_t n, RegionPin pin) {
        if (!room(1, 0) && !flush()) return false;
        out_[nout_] = {const_cast<void *>(p), n};
        ++nout_;
        ++ndata_;
        out_bytes_ += n;
        if (pin) pins_.push_back(std::move(pin));
        if (out_bytes_ >= kMaxOutBytes) return flush();
        return true;
    }
    // True when gathered READ data not sent yet lies in [p, p+n): a WRITE
    // there must wait for it, or the READ would answer with newer bytes.
    // Runs of WRITEs gather only status frames: nothing to scan then.
    bool pending_overlaps(const char *p, size_t n) const {
        if (ndata_ == 0) return false;
        for (size_t i = 0; i < nout_; ++i) {
            const char *b = static_cast<const char *>(out_[i].iov_base);
            if (b < p + n && p < b + out_[i].iov_len && !is_status(b)) return true;
        }
        return false;
    }
    // Small GPU WRITEs are staged on the serving worker's ring: the copies
    // to the device run in the background and their OK frames wait in the
    // output, so every flush first waits for the copies (stage_fence).
    // use_stage: whether `ring` (set up for `device`) is this connection's
    // staging from here on; false sends the request the unbatched way (whose
    // own flush fails if this connection is dead). The ring belongs to the
    // worker serving the connection; every pass ends with the copies fenced
    // and the answers sent (fill() flushes before it would block, Again
    // flushes, Close fences), so a ring is never busy for a connection that
    // another worker may pick up.
    bool use_stage(gpu::StageRing &ring, int device) {
        std::string why;
        if (!ring.ready(device, why)) return false;
        if (stage_ == &ring) return true;
        if (stage_ && !flush()) return false;
        stage_ = &ring;
        stage_h_ = 0;
        stage_used_ = 0;
        return true;
    }
    // A slot of n <= StageRing::kMaxPiece bytes in the current half, or
    // nullptr with `err` (a CUDA failure, or a failed flush). A half is
    // reused once its copies are done and no unsent answer points into it.
    char *stage_slot(size_t n, std::string &err) {
        if (stage_used_ + n > gpu::StageRing::kHalfBytes) {
            if (!stage_->issue(stage_h_, err)) return nullptr;
            stage_h_ ^= 1;
            stage_used_ = 0;
            if (stage_out_[stage_h_] && !flush()) {
                err = "sending answers failed";
                return nullptr;
            }
            if (!stage_->wait(stage_h_, err)) return nullptr;
        }
        char *p = stage_->half(stage_h_) + stage_used_;
        stage_used_ += n;
        return p;
    }
    // A small READ of GPU memory: the copy into a slot is queued and the
    // slot joins the answers (sent after the fence); `pin` keeps the
    // source registered until then.
    bool stage_read(const char *dev, size_t n, RegionPin pin, std::string &err) {
        char *slot = stage_slot(n, err);
        if (!slot) return false;
        stage_->queue(slot, dev, n);
        stage_busy_ = true;
        const int h = stage_h_;
        if (!add_data(slot, n, std::move(pin))) return false;
        // Marked after add_data: a flush inside it clears the marks, and the
        // slot joins the answers only after that flush.
        if (nout_ != 0) stage_out_[h] = true;
        return true;
    }
    // Queues the copy of a staged payload; `pin` keeps the target registered
    // until the copy is done.
    void stage_copy(void *dev, const char *slot, size_t n, RegionPin pin) {
        stage_->queue(dev, slot, n);
        stage_busy_ = true;
        pins_.push_back(std::move(pin));
        // Start the copies early: they overlap with receiving what follows.
        if (stage_->queued_bytes() >= kStageIssueBytes) {
            std::string err;
            if (!stage_->issue(stage_h_, err)) stage_error_ = err;
        }
    }
    // Waits for every staged copy; false (the connection must close) when
    // one failed: no OK frame may then go out.
    bool stage_fence() {
        if (!stage_busy_) return true;
        std::string err = stage_error_;
        if (err.empty() && stage_->issue(stage_h_, err)) {
            stage_->wait(0, err);
            stage_->wait(1, err);
        }
        stage_busy_ = false;
        stage_error_.clear();
        if (err.empty()) return true;
        MC_LOG(Warn, "TCP server: a staged GPU copy failed, closing the connection: " << err);
        err_ = EIO;
        dead_ = true;  // answers were dropped: nothing may be sent after them
        return false;
    }
    const std::string &stage_error() const { return stage_error_; }

    bool flush() {
        if (dead_ || !stage_fence()) {
            nout_ = ndata_ = out_bytes_ = 0;
            pins_.clear();
            return false;
        }
        stage_out_[0] = stage_out_[1] = false;
        if (nout_ == 0) {
            pins_.clear();
            return true;
        }
        IoResult io = sendv_all(fd_, out_, static_cast<int>(nout_));
        nout_ = 0;
        ndata_ = 0;
        out_bytes_ = 0;
        pins_.clear();
        if (!io.ok()) {
            err_ = io.err;
            MC_LOG(Info, "TCP server: sending answers failed: " << io.describe());
        }
        return io.ok();
    }

private:
    bool is_status(const char *b) const {
        const char *st = reinterpret_cast<const char *>(st_);
        return b >= st && b < st + sizeof st_;
    }
    IoResult failed(int e, size_t done) {
        IoResult r;
        r.status = IoStatus::Error;
        r.err = e;
        r.done = done;
        return r;
    }

    static constexpr size_t kStageIssueBytes = 256 << 10;
    gpu::StageRing *stage_ = nullptr;
    int stage_h_ = 0;
    size_t stage_used_ = 0;
    bool stage_busy_ = false;  // copies queued or running since the last fence
    bool stage_out_[2] = {false, false};  // unsent answers point into half h
    bool dead_ = false;                    // a staged copy failed: the connection must close
    std::string stage_error_;

    int fd_, wake_fd_;
    const std::atomic<size_t> &queued_, &idle_;
    int err_ = 0;
    bool drained_ = true;  // the last read left nothing in the socket

public:
    bool after_write_ = false;  // the last request carried a payload
    bool small_write_ = false;  // ... of at most kSmallPayload bytes

private:
    unsigned char in_[kInBuf];
    size_t beg_ = 0, end_ = 0;
    struct iovec out_[kMaxOutIov];
    uint64_t st_[kMaxOutIov];
    size_t nout_ = 0, out_bytes_ = 0;
    size_t ndata_ = 0;  // of the nout_ pieces, READ data (not status frames)
    std::vector<RegionPin> pins_;
};


}  // namespace mcrs
