#include "transport/samehost/samehost_client.h"


#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <sstream>
#include <thread>

#include "common/log.h"
#include "common/socket.h"
#include "transport/samehost/peer_identity.h"
#include "transport/samehost/samehost_wire.h"

namespace mcrs {

namespace {

using Clock = std::chrono::steady_clock;

// A lane takes at most this many bytes of requests at once (unless the
// first alone is bigger), so that big transfers spread over the lanes.
constexpr uint64_t kCoalesceBytes = 4u << 20;
// A lane's run waits for all its statuses before the next one goes out, so
// small requests need long runs: at least this many (the target reads as
// many per pass), within kCoalesceBytes.
constexpr size_t kMinRunRequests = 256;

std::string describe(const TransferItem &it) {
    std::ostringstream s;
    s << "same-host " << (it.opcode == 1 ? "WRITE" : "READ") << " of " << it.length
      << " bytes at remote 0x" << std::hex << it.remote_addr;
    return s.str();
}

// True when the connection has something to say although we asked nothing
// (EOF: the target closed it) or has failed.
bool closed_by_peer(int fd) {
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    int r;
    do r = ::poll(&p, 1, 0);
    while (r < 0 && errno == EINTR);
    return r != 0;
}

// What one status frame did to its item: Next (it has its outcome, go on),
// Last (it has its outcome, but the connection ends), Stop (it has none:
// the frame made no sense; the connection ends).
enum class Settled { Next, Last, Stop };

Settled settle(TransferItem &it, const unsigned char *frame, std::string &why) {
    uint32_t code = 0;
    if (!decode_samehost_status(frame, kSameHostStatusLen, code)) {
        why = "malformed status frame from the target";
        return Settled::Stop;
    }
    if (code == kSameHostOk) {
        it.complete();
    } else if (code == kSameHostCopyFailed) {
        it.fail(describe(it) + " failed: the target could not copy " + (it.opcode == 1 ? "from" : "into") +
                " this process's memory (bad local address?)");
    } else if (code == kSameHostRejected) {
        it.fail(describe(it) + " failed: the peer rejected it: the range is not inside "
                               "one registered, remote-accessible host buffer of the "
                               "target segment");
        why = "an earlier request on its connection was rejected";
        return Settled::Last;
    } else {
        why = "unknown status " + std::to_string(code) + " from the target";
        return Settled::Stop;
    }
    return Settled::Next;
}

}  // namespace

class SameHostClient::Peer {
public:
    Peer(std::shared_ptr<const SegmentDesc> desc, const SameHostClientOptions &opt, const Fallback &fallback,
         std::atomic<uint64_t> &sent)
        : desc_(std::move(desc)), name_(desc_->same_host_socket), opt_(opt), fallback_(fallback), sent_(sent),
          lanes_(opt.lanes_per_peer ? opt.lanes_per_peer : 1) {
        for (auto &l : lanes_) l.thread = std::thread([this, &l] { run(l); });
    }
    ~Peer() { stop(); }

    const std::string &name() const { return name_; }

    void submit(std::vector<TransferItem> &items) {
        std::unique_lock<std::mutex> lk(mu_);
        if (stopping_) {
            lk.unlock();
            for (auto &it : items) it.fail("the engine is shutting down");
            return;
        }
        if (refused_) {
            lk.unlock();
            fallback_(*desc_, items);
            return;
        }
        for (auto &it : items) queue_.push_back(std::move(it));
        lk.unlock();
        cv_.notify_all();
    }

    void stop() {
        std::deque<TransferItem> left;
        {
            std::lock_guard<std::mutex> g(mu_);
            if (stopping_ && joined_) return;
            stopping_ = true;
            left.swap(queue_);
        }
        // Runs in flight are not cut short: the target may be copying into
        // their memory until it answers, so each lane waits for its
        // statuses (bounded by the progress timeout) before it lets go of
        // the items and their pins.
        cv_.notify_all();
        for (auto &it : left) it.fail("the engine is shutting down");
        for (auto &l : lanes_)
            if (l.thread.joinable()) l.thread.join();
        std::lock_guard<std::mutex> g(mu_);
        joined_ = true;
    }

private:
    struct Lane {
        Fd fd;  // its lane's own
        Clock::time_point last_use{};
        std::thread thread;
    };

    size_t run_limit() const { return std::max<size_t>(opt_.pipeline_depth, kMinRunRequests); }

    bool pop_run(std::vector<TransferItem> &run) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return stopping_ || !queue_.empty(); });
        if (stopping_) return false;
        uint64_t bytes = 0;
        while (!queue_.empty() && run.size() < run_limit()) {
            uint64_t len = queue_.front().length;
            if (!run.empty() && bytes + len > kCoalesceBytes) break;
            bytes += len;
            run.push_back(std::move(queue_.front()));
            queue_.pop_front();
        }
        if (!queue_.empty()) cv_.notify_one();
        return true;
    }

    // Connects, checks the target's uid and waits for its greeting.
    bool connect(Lane &l, std::string &why) {
        Fd fd = connect_samehost(name_, why);
        if (!fd.valid()) return false;
        if (!attest_target(fd.get(), why)) return false;
        set_io_timeouts(fd.get(), static_cast<int>(opt_.connect_timeout_ms),
                        static_cast<int>(opt_.progress_timeout_ms));
        unsigned char g[kSameHostStatusLen];
        IoResult io = recv_all(fd.get(), g, sizeof g);
        uint32_t code = 1;
        if (!io.ok()) {
            why = io.status == IoStatus::Eof ? std::string("the target refused this process")
                                             : "no greeting: " + io.describe();
            return false;
        }
        if (!decode_samehost_status(g, sizeof g, code) || code != kSameHostOk) {
            why = "malformed greeting";
            return false;
        }
        set_io_timeouts(fd.get(), static_cast<int>(opt_.progress_timeout_ms),
                        static_cast<int>(opt_.progress_timeout_ms));
        std::lock_guard<std::mutex> g2(mu_);
        if (stopping_) {
            why = "the engine is shutting down";
            return false;
        }
        l.fd = std::move(fd);
        return true;
    }

    void drop(Lane &l) {
        std::lock_guard<std::mutex> g(mu_);
        l.fd.reset();
    }

    // Remembers the refusal, and sends this run and everything queued to
    // the fallback.
    void refuse(std::vector<TransferItem> &run, const std::string &why) {
        {
            std::lock_guard<std::mutex> g(mu_);
            if (!refused_)
                MC_LOG(Info, "same-host path to " << name_ << " unavailable (" << why << "); using TCP");
            refused_ = true;
            while (!queue_.empty()) {
                run.push_back(std::move(queue_.front()));
                queue_.pop_front();
            }
        }
        fallback_(*desc_, run);
    }

    void run(Lane &l) {
        std::vector<TransferItem> run;
        run.reserve(run_limit());
        std::vector<unsigned char> req(run_limit() * kSameHostRequestLen);
        std::vector<unsigned char> st(run_limit() * kSameHostStatusLen);
        for (;;) {
            run.clear();
            if (!pop_run(run)) break;
            if (!ready_lane(l, run)) continue;
            const int fd = l.fd.get();
            IoResult io = send_requests(fd, run, req);
            std::string why;
            size_t next = 0;  // first item without its status
            bool rejected = false;
            if (!io.ok()) why = "sending failed: " + io.describe();
            else sent_.fetch_add(run.size(), std::memory_order_relaxed);
            read_statuses(fd, run, st, next, why, rejected);
            l.last_use = Clock::now();
            if (!why.empty()) {
                drop(l);
                // After a REJECTED the target copied nothing more: the rest
                // of the run goes out again rather than failing for its
                // neighbour's bad range.
                if (rejected) resend(run, next);
                for (size_t i = next; i < run.size(); ++i)
                    if (run[i].pending()) run[i].fail(describe(run[i]) + " failed: " + why);
            }
        }
        drop(l);
    }

    // Puts run[from..] back at the head of the queue, in order (unless the
    // engine is stopping: then they stay in `run` and fail there).
    void resend(std::vector<TransferItem> &run, size_t from) {
        {
            std::lock_guard<std::mutex> g(mu_);
            if (stopping_) return;
            for (size_t i = run.size(); i-- > from;) queue_.push_front(std::move(run[i]));
        }
        run.erase(run.begin() + static_cast<std::ptrdiff_t>(from), run.end());
        cv_.notify_all();
    }

    // Reconnects a stale lane, connects one without a connection; false
    // when that failed and the run went to the fallback (or failed).
    bool ready_lane(Lane &l, std::vector<TransferItem> &run) {
        const bool stale = l.fd.valid() &&
                           (Clock::now() - l.last_use > std::chrono::milliseconds(opt_.reconnect_after_idle_ms) ||
                            closed_by_peer(l.fd.get()));
        if (stale) drop(l);
        if (l.fd.valid()) return true;
        std::string why;
        if (connect(l, why)) return true;
        bool stopping;
        {
            std::lock_guard<std::mutex> g(mu_);
            stopping = stopping_;
        }
        if (stopping)
            for (auto &it : run) it.fail("the engine is shutting down");
        else
            refuse(run, why);
        return false;
    }

    static IoResult send_requests(int fd, const std::vector<TransferItem> &run, std::vector<unsigned char> &req) {
        for (size_t i = 0; i < run.size(); ++i) {
            SameHostRequest r;
            r.opcode = run[i].opcode == 1 ? kSameHostOpWrite : kSameHostOpRead;
            r.target_addr = run[i].remote_addr;
            r.length = run[i].length;
            r.initiator_addr = reinterpret_cast<uint64_t>(run[i].local);
            encode_samehost_request(r, &req[i * kSameHostRequestLen]);
        }
        return send_all(fd, req.data(), run.size() * kSameHostRequestLen);
    }

    // Statuses in order; each item completes as soon as its own status is
    // in. Stops at the first failure, with `why` (items before `next` have
    // their outcome).
    static void read_statuses(int fd, std::vector<TransferItem> &run, std::vector<unsigned char> &st, size_t &next,
                              std::string &why, bool &rejected) {
        size_t got = 0;
        const size_t want = run.size() * kSameHostStatusLen;
        while (why.empty() && got < want) {
            ssize_t n = ::recv(fd, st.data() + got, want - got, 0);
            if (n < 0) {
                if (errno == EINTR) continue;
                why = errno == EAGAIN || errno == EWOULDBLOCK ? "timed out with no progress" : errno_string(errno);
                break;
            }
            if (n == 0) {
                why = "connection closed by the target";
                break;
            }
            got += static_cast<size_t>(n);
            for (; next < got / kSameHostStatusLen; ++next) {
                Settled s = settle(run[next], &st[next * kSameHostStatusLen], why);
                if (s == Settled::Next) continue;
                if (s == Settled::Last) {
                    ++next;
                    rejected = true;
                }
                break;
            }
        }
    }

    const std::shared_ptr<const SegmentDesc> desc_;  // as first seen
    const std::string name_;
    const SameHostClientOptions opt_;
    const Fallback &fallback_;  // the client's, which outlives its peers
    std::atomic<uint64_t> &sent_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<TransferItem> queue_;
    bool stopping_ = false;
    bool joined_ = false;
    bool refused_ = false;
    std::vector<Lane> lanes_;
};

SameHostClient::SameHostClient(SameHostClientOptions opt, Fallback fallback)
    : opt_(opt), fallback_(std::move(fallback)) {}

SameHostClient::~SameHostClient() { stop(); }

void SameHostClient::submit(const std::shared_ptr<const SegmentDesc> &desc, std::vector<TransferItem> &items) {
    const std::string &socket_name = desc->same_host_socket;
    std::shared_ptr<Peer> peer;
    {
        std::lock_guard<std::mutex> g(mu_);
        if (stopped_) {
            for (auto &it : items) it.fail("the engine is shutting down");
            return;
        }
        for (auto &p : peers_)
            if (p->name() == socket_name) {
                peer = p;
                break;
            }
        if (!peer) {
            peer = std::make_shared<Peer>(desc, opt_, fallback_, sent_);
            peers_.push_back(peer);
        }
    }
    peer->submit(items);
}

void SameHostClient::stop() {
    std::vector<std::shared_ptr<Peer>> peers;
    {
        std::lock_guard<std::mutex> g(mu_);
        stopped_ = true;
        peers.swap(peers_);
    }
    for (auto &p : peers) p->stop();
}

}  // namespace mcrs
