// Private to transport/tcp: one lane of the TCP initiator, a persistent
// connection to a peer with a sender and a receiver thread (see
// tcp_client.h for the design).
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/socket.h"
#include "gpu/gpu.h"
#include "transport/tcp/tcp_peer.h"
#include "transport/tcp/tcp_wire.h"
#include "transport/transport.h"

namespace mcrs {

namespace tcp {

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

    // The sender's scratch, sized once: nothing is allocated per run.
    struct SendBuffers {
        explicit SendBuffers(size_t depth) : hdrs(depth) {
            run.reserve(depth);
            iov.reserve(kMaxSendIov + 2);
            pending.reserve(depth);
            entries.reserve(depth);
            for (int h = 0; h < 2; ++h) {
                staged_iov[h].reserve(2 * depth);
                staged[h].reserve(depth);
            }
        }
        std::vector<Queued> run;
        std::vector<struct iovec> iov;
        std::vector<Inflight *> pending;  // entries whose bytes are in `iov`
        std::vector<Inflight *> entries;  // this run's entries
        // Headers of this run, owned by the sender: the receiver may hand an
        // entry back (its answer came) while sendmsg still holds the iovec list.
        std::vector<std::array<unsigned char, kTcpHeaderLen>> hdrs;
        // Small GPU WRITEs: per staging half, the iovec list (headers and
        // staged payloads) and its entries.
        std::vector<struct iovec> staged_iov[2];
        std::vector<Inflight *> staged[2];
    };

    bool connect_locked(std::unique_lock<std::mutex> &lk, std::string &why);
    void send_loop();
    // The steps of send_loop(). admit_run: connects if need be and moves the
    // run into the pipeline; the socket, or -1 once the run has failed.
    int admit_run(SendBuffers &b);
    IoResult send_run(int sock, SendBuffers &b, std::string &gpu_err);
    // Sends what is gathered and marks its entries sent; false on failure.
    bool flush_sends(int sock, SendBuffers &b, IoResult &io);
    bool send_gpu_write(int sock, SendBuffers &b, Inflight &e, unsigned char *hdr, IoResult &io,
                        std::string &gpu_err);
    // Whether run entry `i` is a WRITE of GPU memory small enough to be
    // staged in a batch (the ring set up for its device).
    bool stageable_write(const SendBuffers &b, size_t i);
    // Sends run entries [i, j), all stageable: gathered into one staging
    // half per group with one batched copy, the next group's copy running
    // while the previous group goes out. Returns j, or stops early on failure.
    size_t send_staged_writes(int sock, SendBuffers &b, size_t i, IoResult &io, std::string &gpu_err);
    bool send_staged_half(int sock, SendBuffers &b, int h, IoResult &io, std::string &gpu_err);
    void finish_run(SendBuffers &b, const IoResult &io, const std::string &gpu_err);
    void receive_loop();
    bool read_one(int sock, Inflight &e, std::string &why);
    // Reads the answers of the first `n` (sent, host-memory, v2) entries.
    // Completes entries as their answers arrive; returns false with `why`
    // when the connection must be dropped.
    bool read_batch(std::unique_lock<std::mutex> &lk, size_t n, std::string &why);
    // The steps of read_batch(): the iovec list of n answers (its length),
    // the accounting of `left` bytes that arrived, and the completion of
    // entries [popped, next) outside the lock.
    size_t gather_answers(size_t n);
    bool account_answers(size_t left, size_t n, size_t &next, uint64_t &have, std::string &why);
    void hand_back(std::unique_lock<std::mutex> &lk, size_t &popped, size_t next);
    // Small GPU READs: whether the receive ring serves `device`, and the copy
    // of entries [from, to)'s staged bytes to the device (false with `why`).
    bool stage_ready(int device);
    bool unstage(size_t from, size_t to, std::string &why);
    // Drops the connection and fails everything in flight (the first entry
    // with `why`); after a REJECTED head, fails only that one and queues
    // the rest again.
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
    bool head_rejected_ = false;          // the receiver saw REJECTED for the head
    std::vector<tcp::Queued> resend_;     // receiver's scratch for fail_all_locked
    std::string send_error_;  // why the last send failed, for the receiver's report
    Ring<Inflight> inflight_;  // capacity pipeline_depth: never reallocates
    // Receiver scratch (receiver thread only).
    uint64_t st_[kMaxRecvBatch] = {};
    uint64_t need_[kMaxRecvBatch] = {};
    void *sdst_[kMaxRecvBatch] = {};  // device destination of a staged READ, else null
    struct iovec riov_[2 * kMaxRecvBatch] = {};
    std::vector<TransferItem> done_;
    gpu::StageRing send_stage_;  // sender thread only; set up on first use
    gpu::StageRing recv_stage_;  // receiver thread only (half 0)
    size_t staged_ = 0;          // bytes of the current batch in recv_stage_
    std::thread sender_, receiver_;
};

}  // namespace tcp

}  // namespace mcrs
