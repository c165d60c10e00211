// Proves that src/transport/rdma/verbs_abi.h matches the real libibverbs
// ABI: every struct size, field offset and constant we declare is compared
// with <infiniband/verbs.h> (Debian: libibverbs-dev), at compile time
// (static_assert) and again at run time for a printed summary.
// Build and run: make verbs-abi-check.
#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdio>

#include "transport/rdma/verbs_abi.h"

namespace {

int g_checks = 0;
int g_failed = 0;

void report(const char *what, long long ours, long long real) {
    ++g_checks;
    bool ok = ours == real;
    if (!ok) ++g_failed;
    std::printf("%-4s %-58s ours=%-8lld real=%lld\n", ok ? "ok" : "FAIL", what, ours, real);
}

}  // namespace

namespace v = mcrs::ibv;

#define SIZE(ours, real)                                                   \
    static_assert(sizeof(v::ours) == sizeof(real), "sizeof " #real);       \
    static_assert(alignof(v::ours) == alignof(real), "alignof " #real);    \
    report("sizeof(" #real ")", sizeof(v::ours), sizeof(real))

#define OFF(ours, real, field)                                                          \
    static_assert(offsetof(v::ours, field) == offsetof(real, field), #real "." #field); \
    static_assert(sizeof(v::ours::field) == sizeof(real::field), "size " #real "." #field); \
    report("offsetof(" #real ", " #field ")", offsetof(v::ours, field), offsetof(real, field))

// Offset only, for nested members (sizeof(T::a.b) is not valid C++).
#define OFFN(ours, real, field)                                                         \
    static_assert(offsetof(v::ours, field) == offsetof(real, field), #real "." #field); \
    report("offsetof(" #real ", " #field ")", offsetof(v::ours, field), offsetof(real, field))

#define CONST(name)                                                               \
    static_assert(static_cast<long long>(v::name) == static_cast<long long>(name), #name); \
    report(#name, static_cast<long long>(v::name), static_cast<long long>(name))

static void check_device() {
    SIZE(gid, ibv_gid);
    OFF(gid, ibv_gid, raw);
    OFFN(gid, ibv_gid, global.subnet_prefix);
    OFFN(gid, ibv_gid, global.interface_id);

    SIZE(device, ibv_device);
    OFF(device, ibv_device, node_type);
    OFF(device, ibv_device, transport_type);
    OFF(device, ibv_device, name);
    OFF(device, ibv_device, dev_name);
    OFF(device, ibv_device, dev_path);
    OFF(device, ibv_device, ibdev_path);
    CONST(IBV_SYSFS_NAME_MAX);
    CONST(IBV_SYSFS_PATH_MAX);
    CONST(IBV_NODE_UNKNOWN);
    CONST(IBV_NODE_CA);
    CONST(IBV_NODE_SWITCH);
    CONST(IBV_NODE_ROUTER);
    CONST(IBV_NODE_RNIC);
    CONST(IBV_TRANSPORT_UNKNOWN);
    CONST(IBV_TRANSPORT_IB);
    CONST(IBV_TRANSPORT_IWARP);

    SIZE(context_ops, ibv_context_ops);
    OFF(context_ops, ibv_context_ops, alloc_mw);
    OFF(context_ops, ibv_context_ops, bind_mw);
    OFF(context_ops, ibv_context_ops, dealloc_mw);
    OFF(context_ops, ibv_context_ops, poll_cq);
    OFF(context_ops, ibv_context_ops, req_notify_cq);
    OFF(context_ops, ibv_context_ops, post_srq_recv);
    OFF(context_ops, ibv_context_ops, post_send);
    OFF(context_ops, ibv_context_ops, post_recv);
    static_assert(offsetof(v::context_ops, compat_async_event) + sizeof(void *) ==
                      sizeof(ibv_context_ops),
                  "last ops slot");

    SIZE(context, ibv_context);
    OFF(context, ibv_context, device);
    OFF(context, ibv_context, ops);
    OFF(context, ibv_context, cmd_fd);
    OFF(context, ibv_context, async_fd);
    OFF(context, ibv_context, num_comp_vectors);
    OFF(context, ibv_context, mutex);
    OFF(context, ibv_context, abi_compat);
}

static void check_attrs() {
    SIZE(device_attr, ibv_device_attr);
    OFF(device_attr, ibv_device_attr, fw_ver);
    OFF(device_attr, ibv_device_attr, node_guid);
    OFF(device_attr, ibv_device_attr, sys_image_guid);
    OFF(device_attr, ibv_device_attr, max_mr_size);
    OFF(device_attr, ibv_device_attr, page_size_cap);
    OFF(device_attr, ibv_device_attr, vendor_id);
    OFF(device_attr, ibv_device_attr, vendor_part_id);
    OFF(device_attr, ibv_device_attr, hw_ver);
    OFF(device_attr, ibv_device_attr, max_qp);
    OFF(device_attr, ibv_device_attr, max_qp_wr);
    OFF(device_attr, ibv_device_attr, device_cap_flags);
    OFF(device_attr, ibv_device_attr, max_sge);
    OFF(device_attr, ibv_device_attr, max_sge_rd);
    OFF(device_attr, ibv_device_attr, max_cq);
    OFF(device_attr, ibv_device_attr, max_cqe);
    OFF(device_attr, ibv_device_attr, max_mr);
    OFF(device_attr, ibv_device_attr, max_pd);
    OFF(device_attr, ibv_device_attr, max_qp_rd_atom);
    OFF(device_attr, ibv_device_attr, max_res_rd_atom);
    OFF(device_attr, ibv_device_attr, max_qp_init_rd_atom);
    OFF(device_attr, ibv_device_attr, atomic_cap);
    OFF(device_attr, ibv_device_attr, max_mw);
    OFF(device_attr, ibv_device_attr, max_ah);
    OFF(device_attr, ibv_device_attr, max_srq);
    OFF(device_attr, ibv_device_attr, max_srq_wr);
    OFF(device_attr, ibv_device_attr, max_srq_sge);
    OFF(device_attr, ibv_device_attr, max_pkeys);
    OFF(device_attr, ibv_device_attr, local_ca_ack_delay);
    OFF(device_attr, ibv_device_attr, phys_port_cnt);
    CONST(IBV_ATOMIC_NONE);
    CONST(IBV_ATOMIC_HCA);
    CONST(IBV_ATOMIC_GLOB);

    SIZE(port_attr, ibv_port_attr);
    OFF(port_attr, ibv_port_attr, state);
    OFF(port_attr, ibv_port_attr, max_mtu);
    OFF(port_attr, ibv_port_attr, active_mtu);
    OFF(port_attr, ibv_port_attr, gid_tbl_len);
    OFF(port_attr, ibv_port_attr, port_cap_flags);
    OFF(port_attr, ibv_port_attr, max_msg_sz);
    OFF(port_attr, ibv_port_attr, bad_pkey_cntr);
    OFF(port_attr, ibv_port_attr, qkey_viol_cntr);
    OFF(port_attr, ibv_port_attr, pkey_tbl_len);
    OFF(port_attr, ibv_port_attr, lid);
    OFF(port_attr, ibv_port_attr, sm_lid);
    OFF(port_attr, ibv_port_attr, lmc);
    OFF(port_attr, ibv_port_attr, max_vl_num);
    OFF(port_attr, ibv_port_attr, sm_sl);
    OFF(port_attr, ibv_port_attr, subnet_timeout);
    OFF(port_attr, ibv_port_attr, init_type_reply);
    OFF(port_attr, ibv_port_attr, active_width);
    OFF(port_attr, ibv_port_attr, active_speed);
    OFF(port_attr, ibv_port_attr, phys_state);
    OFF(port_attr, ibv_port_attr, link_layer);
    OFF(port_attr, ibv_port_attr, flags);
    OFF(port_attr, ibv_port_attr, port_cap_flags2);
    CONST(IBV_MTU_256);
    CONST(IBV_MTU_512);
    CONST(IBV_MTU_1024);
    CONST(IBV_MTU_2048);
    CONST(IBV_MTU_4096);
    CONST(IBV_PORT_NOP);
    CONST(IBV_PORT_DOWN);
    CONST(IBV_PORT_INIT);
    CONST(IBV_PORT_ARMED);
    CONST(IBV_PORT_ACTIVE);
    CONST(IBV_PORT_ACTIVE_DEFER);
    CONST(IBV_LINK_LAYER_UNSPECIFIED);
    CONST(IBV_LINK_LAYER_INFINIBAND);
    CONST(IBV_LINK_LAYER_ETHERNET);
    CONST(IBV_PORT_IP_BASED_GIDS);
}

static void check_events() {
    SIZE(async_event, ibv_async_event);
    OFF(async_event, ibv_async_event, element);
    OFFN(async_event, ibv_async_event, element.cq);
    OFFN(async_event, ibv_async_event, element.qp);
    OFFN(async_event, ibv_async_event, element.port_num);
    OFF(async_event, ibv_async_event, event_type);
    CONST(IBV_EVENT_CQ_ERR);
    CONST(IBV_EVENT_QP_FATAL);
    CONST(IBV_EVENT_QP_REQ_ERR);
    CONST(IBV_EVENT_QP_ACCESS_ERR);
    CONST(IBV_EVENT_COMM_EST);
    CONST(IBV_EVENT_SQ_DRAINED);
    CONST(IBV_EVENT_PATH_MIG);
    CONST(IBV_EVENT_PATH_MIG_ERR);
    CONST(IBV_EVENT_DEVICE_FATAL);
    CONST(IBV_EVENT_PORT_ACTIVE);
    CONST(IBV_EVENT_PORT_ERR);
    CONST(IBV_EVENT_LID_CHANGE);
    CONST(IBV_EVENT_PKEY_CHANGE);
    CONST(IBV_EVENT_SM_CHANGE);
    CONST(IBV_EVENT_SRQ_ERR);
    CONST(IBV_EVENT_SRQ_LIMIT_REACHED);
    CONST(IBV_EVENT_QP_LAST_WQE_REACHED);
    CONST(IBV_EVENT_CLIENT_REREGISTER);
    CONST(IBV_EVENT_GID_CHANGE);
    CONST(IBV_EVENT_WQ_FATAL);
}

static void check_wc() {
    SIZE(wc, ibv_wc);
    OFF(wc, ibv_wc, wr_id);
    OFF(wc, ibv_wc, status);
    OFF(wc, ibv_wc, opcode);
    OFF(wc, ibv_wc, vendor_err);
    OFF(wc, ibv_wc, byte_len);
    OFF(wc, ibv_wc, imm_data);
    OFF(wc, ibv_wc, invalidated_rkey);
    OFF(wc, ibv_wc, qp_num);
    OFF(wc, ibv_wc, src_qp);
    OFF(wc, ibv_wc, wc_flags);
    OFF(wc, ibv_wc, pkey_index);
    OFF(wc, ibv_wc, slid);
    OFF(wc, ibv_wc, sl);
    OFF(wc, ibv_wc, dlid_path_bits);
    CONST(IBV_WC_SUCCESS);
    CONST(IBV_WC_LOC_LEN_ERR);
    CONST(IBV_WC_LOC_QP_OP_ERR);
    CONST(IBV_WC_LOC_EEC_OP_ERR);
    CONST(IBV_WC_LOC_PROT_ERR);
    CONST(IBV_WC_WR_FLUSH_ERR);
    CONST(IBV_WC_MW_BIND_ERR);
    CONST(IBV_WC_BAD_RESP_ERR);
    CONST(IBV_WC_LOC_ACCESS_ERR);
    CONST(IBV_WC_REM_INV_REQ_ERR);
    CONST(IBV_WC_REM_ACCESS_ERR);
    CONST(IBV_WC_REM_OP_ERR);
    CONST(IBV_WC_RETRY_EXC_ERR);
    CONST(IBV_WC_RNR_RETRY_EXC_ERR);
    CONST(IBV_WC_LOC_RDD_VIOL_ERR);
    CONST(IBV_WC_REM_INV_RD_REQ_ERR);
    CONST(IBV_WC_REM_ABORT_ERR);
    CONST(IBV_WC_INV_EECN_ERR);
    CONST(IBV_WC_INV_EEC_STATE_ERR);
    CONST(IBV_WC_FATAL_ERR);
    CONST(IBV_WC_RESP_TIMEOUT_ERR);
    CONST(IBV_WC_GENERAL_ERR);
    CONST(IBV_WC_SEND);
    CONST(IBV_WC_RDMA_WRITE);
    CONST(IBV_WC_RDMA_READ);
    CONST(IBV_WC_COMP_SWAP);
    CONST(IBV_WC_FETCH_ADD);
    CONST(IBV_WC_RECV);
    CONST(IBV_WC_RECV_RDMA_WITH_IMM);
}

static void check_memory() {
    SIZE(pd, ibv_pd);
    OFF(pd, ibv_pd, context);
    OFF(pd, ibv_pd, handle);
    SIZE(mr, ibv_mr);
    OFF(mr, ibv_mr, context);
    OFF(mr, ibv_mr, pd);
    OFF(mr, ibv_mr, addr);
    OFF(mr, ibv_mr, length);
    OFF(mr, ibv_mr, handle);
    OFF(mr, ibv_mr, lkey);
    OFF(mr, ibv_mr, rkey);
    CONST(IBV_ACCESS_LOCAL_WRITE);
    CONST(IBV_ACCESS_REMOTE_WRITE);
    CONST(IBV_ACCESS_REMOTE_READ);
    CONST(IBV_ACCESS_REMOTE_ATOMIC);
    CONST(IBV_ACCESS_RELAXED_ORDERING);
    CONST(IBV_ACCESS_OPTIONAL_RANGE);
}

// A table of offsets and sizes, one line per field, kept whole so it
// reads like the verbs header it checks.
static void check_qp() {
    SIZE(global_route, ibv_global_route);
    OFF(global_route, ibv_global_route, dgid);
    OFF(global_route, ibv_global_route, flow_label);
    OFF(global_route, ibv_global_route, sgid_index);
    OFF(global_route, ibv_global_route, hop_limit);
    OFF(global_route, ibv_global_route, traffic_class);
    SIZE(ah_attr, ibv_ah_attr);
    OFF(ah_attr, ibv_ah_attr, grh);
    OFF(ah_attr, ibv_ah_attr, dlid);
    OFF(ah_attr, ibv_ah_attr, sl);
    OFF(ah_attr, ibv_ah_attr, src_path_bits);
    OFF(ah_attr, ibv_ah_attr, static_rate);
    OFF(ah_attr, ibv_ah_attr, is_global);
    OFF(ah_attr, ibv_ah_attr, port_num);

    SIZE(qp_cap, ibv_qp_cap);
    OFF(qp_cap, ibv_qp_cap, max_send_wr);
    OFF(qp_cap, ibv_qp_cap, max_recv_wr);
    OFF(qp_cap, ibv_qp_cap, max_send_sge);
    OFF(qp_cap, ibv_qp_cap, max_recv_sge);
    OFF(qp_cap, ibv_qp_cap, max_inline_data);
    SIZE(qp_init_attr, ibv_qp_init_attr);
    OFF(qp_init_attr, ibv_qp_init_attr, qp_context);
    OFF(qp_init_attr, ibv_qp_init_attr, send_cq);
    OFF(qp_init_attr, ibv_qp_init_attr, recv_cq);
    OFF(qp_init_attr, ibv_qp_init_attr, srq);
    OFF(qp_init_attr, ibv_qp_init_attr, cap);
    OFF(qp_init_attr, ibv_qp_init_attr, qp_type);
    OFF(qp_init_attr, ibv_qp_init_attr, sq_sig_all);
    CONST(IBV_QPT_RC);
    CONST(IBV_QPT_UC);
    CONST(IBV_QPT_UD);

    SIZE(qp_attr, ibv_qp_attr);
    OFF(qp_attr, ibv_qp_attr, qp_state);
    OFF(qp_attr, ibv_qp_attr, cur_qp_state);
    OFF(qp_attr, ibv_qp_attr, path_mtu);
    OFF(qp_attr, ibv_qp_attr, path_mig_state);
    OFF(qp_attr, ibv_qp_attr, qkey);
    OFF(qp_attr, ibv_qp_attr, rq_psn);
    OFF(qp_attr, ibv_qp_attr, sq_psn);
    OFF(qp_attr, ibv_qp_attr, dest_qp_num);
    OFF(qp_attr, ibv_qp_attr, qp_access_flags);
    OFF(qp_attr, ibv_qp_attr, cap);
    OFF(qp_attr, ibv_qp_attr, ah_attr);
    OFF(qp_attr, ibv_qp_attr, alt_ah_attr);
    OFF(qp_attr, ibv_qp_attr, pkey_index);
    OFF(qp_attr, ibv_qp_attr, alt_pkey_index);
    OFF(qp_attr, ibv_qp_attr, en_sqd_async_notify);
    OFF(qp_attr, ibv_qp_attr, sq_draining);
    OFF(qp_attr, ibv_qp_attr, max_rd_atomic);
    OFF(qp_attr, ibv_qp_attr, max_dest_rd_atomic);
    OFF(qp_attr, ibv_qp_attr, min_rnr_timer);
    OFF(qp_attr, ibv_qp_attr, port_num);
    OFF(qp_attr, ibv_qp_attr, timeout);
    OFF(qp_attr, ibv_qp_attr, retry_cnt);
    OFF(qp_attr, ibv_qp_attr, rnr_retry);
    OFF(qp_attr, ibv_qp_attr, alt_port_num);
    OFF(qp_attr, ibv_qp_attr, alt_timeout);
    OFF(qp_attr, ibv_qp_attr, rate_limit);
    CONST(IBV_QP_STATE);
    CONST(IBV_QP_CUR_STATE);
    CONST(IBV_QP_EN_SQD_ASYNC_NOTIFY);
    CONST(IBV_QP_ACCESS_FLAGS);
    CONST(IBV_QP_PKEY_INDEX);
    CONST(IBV_QP_PORT);
    CONST(IBV_QP_QKEY);
    CONST(IBV_QP_AV);
    CONST(IBV_QP_PATH_MTU);
    CONST(IBV_QP_TIMEOUT);
    CONST(IBV_QP_RETRY_CNT);
    CONST(IBV_QP_RNR_RETRY);
    CONST(IBV_QP_RQ_PSN);
    CONST(IBV_QP_MAX_QP_RD_ATOMIC);
    CONST(IBV_QP_ALT_PATH);
    CONST(IBV_QP_MIN_RNR_TIMER);
    CONST(IBV_QP_SQ_PSN);
    CONST(IBV_QP_MAX_DEST_RD_ATOMIC);
    CONST(IBV_QP_PATH_MIG_STATE);
    CONST(IBV_QP_CAP);
    CONST(IBV_QP_DEST_QPN);
    CONST(IBV_QP_RATE_LIMIT);
    CONST(IBV_QPS_RESET);
    CONST(IBV_QPS_INIT);
    CONST(IBV_QPS_RTR);
    CONST(IBV_QPS_RTS);
    CONST(IBV_QPS_SQD);
    CONST(IBV_QPS_SQE);
    CONST(IBV_QPS_ERR);
    CONST(IBV_QPS_UNKNOWN);
    CONST(IBV_MIG_MIGRATED);
    CONST(IBV_MIG_REARM);
    CONST(IBV_MIG_ARMED);

    SIZE(qp, ibv_qp);
    OFF(qp, ibv_qp, context);
    OFF(qp, ibv_qp, qp_context);
    OFF(qp, ibv_qp, pd);
    OFF(qp, ibv_qp, send_cq);
    OFF(qp, ibv_qp, recv_cq);
    OFF(qp, ibv_qp, srq);
    OFF(qp, ibv_qp, handle);
    OFF(qp, ibv_qp, qp_num);
    OFF(qp, ibv_qp, state);
    OFF(qp, ibv_qp, qp_type);
    OFF(qp, ibv_qp, mutex);
    OFF(qp, ibv_qp, cond);
    OFF(qp, ibv_qp, events_completed);

    SIZE(comp_channel, ibv_comp_channel);
    OFF(comp_channel, ibv_comp_channel, context);
    OFF(comp_channel, ibv_comp_channel, fd);
    OFF(comp_channel, ibv_comp_channel, refcnt);
    SIZE(cq, ibv_cq);
    OFF(cq, ibv_cq, context);
    OFF(cq, ibv_cq, channel);
    OFF(cq, ibv_cq, cq_context);
    OFF(cq, ibv_cq, handle);
    OFF(cq, ibv_cq, cqe);
    OFF(cq, ibv_cq, mutex);
    OFF(cq, ibv_cq, cond);
    OFF(cq, ibv_cq, comp_events_completed);
    OFF(cq, ibv_cq, async_events_completed);
}

static void check_wr() {
    SIZE(sge, ibv_sge);
    OFF(sge, ibv_sge, addr);
    OFF(sge, ibv_sge, length);
    OFF(sge, ibv_sge, lkey);
    SIZE(mw_bind_info, ibv_mw_bind_info);
    OFF(mw_bind_info, ibv_mw_bind_info, mr);
    OFF(mw_bind_info, ibv_mw_bind_info, addr);
    OFF(mw_bind_info, ibv_mw_bind_info, length);
    OFF(mw_bind_info, ibv_mw_bind_info, mw_access_flags);
    SIZE(send_wr, ibv_send_wr);
    OFF(send_wr, ibv_send_wr, wr_id);
    OFF(send_wr, ibv_send_wr, next);
    OFF(send_wr, ibv_send_wr, sg_list);
    OFF(send_wr, ibv_send_wr, num_sge);
    OFF(send_wr, ibv_send_wr, opcode);
    OFF(send_wr, ibv_send_wr, send_flags);
    OFF(send_wr, ibv_send_wr, imm_data);
    OFF(send_wr, ibv_send_wr, invalidate_rkey);
    OFF(send_wr, ibv_send_wr, wr);
    OFFN(send_wr, ibv_send_wr, wr.rdma.remote_addr);
    OFFN(send_wr, ibv_send_wr, wr.rdma.rkey);
    OFFN(send_wr, ibv_send_wr, wr.atomic.remote_addr);
    OFFN(send_wr, ibv_send_wr, wr.atomic.compare_add);
    OFFN(send_wr, ibv_send_wr, wr.atomic.swap);
    OFFN(send_wr, ibv_send_wr, wr.atomic.rkey);
    OFFN(send_wr, ibv_send_wr, wr.ud.ah);
    OFFN(send_wr, ibv_send_wr, wr.ud.remote_qpn);
    OFFN(send_wr, ibv_send_wr, wr.ud.remote_qkey);
    OFF(send_wr, ibv_send_wr, qp_type);
    OFFN(send_wr, ibv_send_wr, qp_type.xrc.remote_srqn);
    OFF(send_wr, ibv_send_wr, bind_mw);
    OFFN(send_wr, ibv_send_wr, bind_mw.rkey);
    OFFN(send_wr, ibv_send_wr, bind_mw.bind_info);
    OFF(send_wr, ibv_send_wr, tso);
    OFFN(send_wr, ibv_send_wr, tso.hdr_sz);
    OFFN(send_wr, ibv_send_wr, tso.mss);
    SIZE(recv_wr, ibv_recv_wr);
    OFF(recv_wr, ibv_recv_wr, wr_id);
    OFF(recv_wr, ibv_recv_wr, next);
    OFF(recv_wr, ibv_recv_wr, sg_list);
    OFF(recv_wr, ibv_recv_wr, num_sge);
    CONST(IBV_WR_RDMA_WRITE);
    CONST(IBV_WR_RDMA_WRITE_WITH_IMM);
    CONST(IBV_WR_SEND);
    CONST(IBV_WR_SEND_WITH_IMM);
    CONST(IBV_WR_RDMA_READ);
    CONST(IBV_WR_ATOMIC_CMP_AND_SWP);
    CONST(IBV_WR_ATOMIC_FETCH_AND_ADD);
    CONST(IBV_SEND_FENCE);
    CONST(IBV_SEND_SIGNALED);
    CONST(IBV_SEND_SOLICITED);
    CONST(IBV_SEND_INLINE);
}

// The inline data-path verbs must reach the same slot as the real ones: a
// context built with our layout, read through the real type.
static int fake_poll(v::cq *, int n, v::wc *) { return n + 1; }
static int fake_post(v::qp *, v::send_wr *, v::send_wr **) { return 42; }

static void check_dispatch() {
    v::context ctx{};
    ctx.ops.poll_cq = fake_poll;
    ctx.ops.post_send = fake_post;
    v::cq c{};
    c.context = &ctx;
    v::qp q{};
    q.context = &ctx;
    report("ours poll_cq dispatch", v::poll_cq(&c, 6, nullptr), 7);
    report("ours post_send dispatch", v::post_send(&q, nullptr, nullptr), 42);
    auto *real_ctx = reinterpret_cast<ibv_context *>(&ctx);
    report("real ops.poll_cq slot", reinterpret_cast<void *>(real_ctx->ops.poll_cq) ==
                                        reinterpret_cast<void *>(fake_poll), 1);
    report("real ops.post_send slot", reinterpret_cast<void *>(real_ctx->ops.post_send) ==
                                          reinterpret_cast<void *>(fake_post), 1);
}

int main() {
    check_device();
    check_attrs();
    check_events();
    check_wc();
    check_memory();
    check_qp();
    check_wr();
    check_dispatch();
    std::printf("verbs-abi-check: %d checks, %d failed\n", g_checks, g_failed);
    return g_failed == 0 ? 0 : 1;
}
