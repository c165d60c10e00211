// Completion queues and completion channels.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "sv_state.h"

using namespace sv;

SV_EXPORT ibv::comp_channel *ibv_create_comp_channel(ibv::context *context) {
    Context *ctx = impl_of<Context>(context);
    int fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
    if (fd < 0) return nullptr;
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    auto *ch = new Channel();
    ch->h.impl = ch;
    ch->ctx = ctx;
    ch->fd = fd;
    ch->h.abi.context = context;
    ch->h.abi.fd = fd;
    ctx->channels.insert(ch);
    return &ch->h.abi;
}

SV_EXPORT int ibv_destroy_comp_channel(ibv::comp_channel *channel) {
    Channel *ch = impl_of<Channel>(channel);
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    if (ch->cqs > 0) return EBUSY;
    ch->ctx->channels.erase(ch);
    free_channel(ch);
    return 0;
}

SV_EXPORT ibv::cq *ibv_create_cq(ibv::context *context, int cqe, void *cq_context,
                                 ibv::comp_channel *channel, int comp_vector) {
    Context *ctx = impl_of<Context>(context);
    Channel *ch = impl_of<Channel>(channel);
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    if (cqe < 1 || cqe > ctx->dev->spec.max_cqe) return fail_null<ibv::cq>(EINVAL);
    if (comp_vector < 0 || comp_vector >= context->num_comp_vectors) return fail_null<ibv::cq>(EINVAL);
    if (ch && ch->ctx != ctx) return fail_null<ibv::cq>(EINVAL);
    auto *c = new Cq();
    c->h.impl = c;
    c->ctx = ctx;
    c->channel = ch;
    c->capacity = cqe;
    ibv::cq &abi = c->h.abi;
    abi.context = context;
    abi.channel = channel;
    abi.cq_context = cq_context;
    abi.cqe = cqe;
    pthread_mutex_init(&abi.mutex, nullptr);
    pthread_cond_init(&abi.cond, nullptr);
    if (ch) ++ch->cqs;
    ctx->cqs.insert(c);
    return &abi;
}

SV_EXPORT int ibv_destroy_cq(ibv::cq *cq) {
    Cq *c = impl_of<Cq>(cq);
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    if (c->qps > 0) return EBUSY;
    c->ctx->cqs.erase(c);
    free_cq(c);
    return 0;
}

SV_EXPORT int ibv_get_cq_event(ibv::comp_channel *channel, ibv::cq **cq, void **cq_context) {
    Channel *ch = impl_of<Channel>(channel);
    for (;;) {
        uint64_t count = 0;
        if (read(ch->fd, &count, sizeof(count)) != static_cast<ssize_t>(sizeof(count))) return -1;
        std::lock_guard<std::mutex> lock(ch->mu);
        if (ch->events.empty()) continue;
        Cq *c = ch->events.front();
        ch->events.pop_front();
        if (!c) continue;  // its CQ was destroyed meanwhile
        *cq = &c->h.abi;
        *cq_context = c->h.abi.cq_context;
        return 0;
    }
}

SV_EXPORT void ibv_ack_cq_events(ibv::cq *cq, unsigned int nevents) {
    Cq *c = impl_of<Cq>(cq);
    std::lock_guard<std::mutex> lock(c->mu);
    c->h.abi.comp_events_completed += nevents;
}

namespace sv {

void free_cq(Cq *c) {
    if (c->channel) {
        std::lock_guard<std::mutex> lock(c->channel->mu);
        std::replace(c->channel->events.begin(), c->channel->events.end(), c, static_cast<Cq *>(nullptr));
        --c->channel->cqs;
    }
    pthread_mutex_destroy(&c->h.abi.mutex);
    pthread_cond_destroy(&c->h.abi.cond);
    delete c;
}

void free_channel(Channel *ch) {
    close(ch->fd);
    delete ch;
}

bool push_completion(Cq *c, const Cqe &e) {
    bool raise_overrun = false;
    {
        std::lock_guard<std::mutex> lock(c->mu);
        if (static_cast<int>(c->entries.size()) >= c->capacity) {
            // CQ overrun: the completion is lost and the CQ reports an error.
            raise_overrun = !c->overrun;
            c->overrun = true;
        } else {
            c->entries.push_back(e);
            if (c->armed && c->channel) {
                c->armed = false;
                std::lock_guard<std::mutex> l2(c->channel->mu);
                c->channel->events.push_back(c);
                uint64_t one = 1;
                ssize_t n = write(c->channel->fd, &one, sizeof(one));
                (void)n;
            }
            return true;
        }
    }
    if (raise_overrun) {
        ibv::async_event ev{};
        ev.element.cq = &c->h.abi;
        ev.event_type = ibv::IBV_EVENT_CQ_ERR;
        push_async_event(c->ctx, ev);
    }
    return false;
}

}  // namespace sv

int sv::op_poll_cq(ibv::cq *cq, int num_entries, ibv::wc *wc) {
    Cq *c = impl_of<Cq>(cq);
    if (num_entries < 0) return -1;
    struct Freed {
        std::shared_ptr<Qp> qp;
        uint64_t seq;
        uint32_t epoch;
    };
    std::vector<Freed> freed;
    int n = 0;
    {
        std::lock_guard<std::mutex> lock(c->mu);
        while (n < num_entries && !c->entries.empty()) {
            Cqe &e = c->entries.front();
            wc[n++] = e.wc;
            freed.push_back({std::move(e.qp), e.seq, e.epoch});
            c->entries.pop_front();
        }
    }
    // Polling a completion frees its send-queue slot and all before it.
    for (Freed &f : freed) {
        std::lock_guard<std::mutex> lock(f.qp->post_mu);
        if (f.epoch == f.qp->epoch.load() && f.seq + 1 > f.qp->freed) f.qp->freed = f.seq + 1;
    }
    return n;
}

int sv::op_req_notify_cq(ibv::cq *cq, int) {
    Cq *c = impl_of<Cq>(cq);
    std::lock_guard<std::mutex> lock(c->mu);
    c->armed = true;
    return 0;
}
