// Our own declarations of the part of the libibverbs ABI (x86-64 Linux,
// rdma-core) that the RDMA transport uses. The engine loads the verbs
// library at run time (verbs_loader.h), so it must not need rdma-core
// headers to build; these types mirror the real ones byte for byte.
// tools/verbs_abi_check.cpp compares every size, offset and constant here
// with <infiniband/verbs.h> (`make verbs-abi-check`).
//
// Everything lives in mcrs::ibv so a translation unit can include this and
// the real header side by side. Type names drop the ibv_ prefix
// (ibv::qp == struct ibv_qp, ibv::wc_status == enum ibv_wc_status); fields
// and constants keep their real names (qp->context, ibv::IBV_QPS_RTS).
// Where a field is named like a type (qp_attr::qp_state) the declaration
// says `enum qp_state` / `struct context` so both names stay usable.
#pragma once

#include <pthread.h>

#include <cstddef>
#include <cstdint>

namespace mcrs {
namespace ibv {

struct context;
struct cq;
struct qp;
struct srq;
struct pd;
struct mr;
struct mw;
struct ah;
struct wq;

enum { IBV_SYSFS_NAME_MAX = 64, IBV_SYSFS_PATH_MAX = 256 };

union gid {
    uint8_t raw[16];
    struct {
        uint64_t subnet_prefix;  // big endian
        uint64_t interface_id;   // big endian
    } global;
};

enum node_type : int {
    IBV_NODE_UNKNOWN = -1,
    IBV_NODE_CA = 1,
    IBV_NODE_SWITCH = 2,
    IBV_NODE_ROUTER = 3,
    IBV_NODE_RNIC = 4,
};

enum transport_type : int {
    IBV_TRANSPORT_UNKNOWN = -1,
    IBV_TRANSPORT_IB = 0,
    IBV_TRANSPORT_IWARP = 1,
};

// struct _ibv_device_ops: two slots libibverbs no longer uses.
struct device_ops_abi {
    void *(*unused_alloc_context)(void *device, int cmd_fd);
    void (*unused_free_context)(void *context);
};

struct device {
    device_ops_abi ops_abi;
    enum node_type node_type;
    enum transport_type transport_type;
    char name[IBV_SYSFS_NAME_MAX];        // kernel device, e.g. mlx5_0
    char dev_name[IBV_SYSFS_NAME_MAX];    // uverbs device, e.g. uverbs0
    char dev_path[IBV_SYSFS_PATH_MAX];    // .../class/infiniband_verbs/uverbs0
    char ibdev_path[IBV_SYSFS_PATH_MAX];  // .../class/infiniband/mlx5_0
};

enum atomic_cap : int { IBV_ATOMIC_NONE = 0, IBV_ATOMIC_HCA = 1, IBV_ATOMIC_GLOB = 2 };

struct device_attr {
    char fw_ver[64];
    uint64_t node_guid;
    uint64_t sys_image_guid;
    uint64_t max_mr_size;
    uint64_t page_size_cap;
    uint32_t vendor_id;
    uint32_t vendor_part_id;
    uint32_t hw_ver;
    int max_qp;
    int max_qp_wr;
    unsigned int device_cap_flags;
    int max_sge;
    int max_sge_rd;
    int max_cq;
    int max_cqe;
    int max_mr;
    int max_pd;
    int max_qp_rd_atom;
    int max_ee_rd_atom;
    int max_res_rd_atom;
    int max_qp_init_rd_atom;
    int max_ee_init_rd_atom;
    enum atomic_cap atomic_cap;
    int max_ee;
    int max_rdd;
    int max_mw;
    int max_raw_ipv6_qp;
    int max_raw_ethy_qp;
    int max_mcast_grp;
    int max_mcast_qp_attach;
    int max_total_mcast_qp_attach;
    int max_ah;
    int max_fmr;
    int max_map_per_fmr;
    int max_srq;
    int max_srq_wr;
    int max_srq_sge;
    uint16_t max_pkeys;
    uint8_t local_ca_ack_delay;
    uint8_t phys_port_cnt;
};

enum mtu : int {
    IBV_MTU_256 = 1,
    IBV_MTU_512 = 2,
    IBV_MTU_1024 = 3,
    IBV_MTU_2048 = 4,
    IBV_MTU_4096 = 5,
};

enum port_state : int {
    IBV_PORT_NOP = 0,
    IBV_PORT_DOWN = 1,
    IBV_PORT_INIT = 2,
    IBV_PORT_ARMED = 3,
    IBV_PORT_ACTIVE = 4,
    IBV_PORT_ACTIVE_DEFER = 5,
};

enum {
    IBV_LINK_LAYER_UNSPECIFIED = 0,
    IBV_LINK_LAYER_INFINIBAND = 1,
    IBV_LINK_LAYER_ETHERNET = 2,
};

// port_cap_flags bit that RoCE ports set.
enum { IBV_PORT_IP_BASED_GIDS = 1 << 26 };

struct port_attr {
    port_state state;
    mtu max_mtu;
    mtu active_mtu;
    int gid_tbl_len;
    uint32_t port_cap_flags;
    uint32_t max_msg_sz;
    uint32_t bad_pkey_cntr;
    uint32_t qkey_viol_cntr;
    uint16_t pkey_tbl_len;
    uint16_t lid;
    uint16_t sm_lid;
    uint8_t lmc;
    uint8_t max_vl_num;
    uint8_t sm_sl;
    uint8_t subnet_timeout;
    uint8_t init_type_reply;
    uint8_t active_width;
    uint8_t active_speed;
    uint8_t phys_state;
    uint8_t link_layer;
    uint8_t flags;
    uint16_t port_cap_flags2;
};

enum event_type : int {
    IBV_EVENT_CQ_ERR,
    IBV_EVENT_QP_FATAL,
    IBV_EVENT_QP_REQ_ERR,
    IBV_EVENT_QP_ACCESS_ERR,
    IBV_EVENT_COMM_EST,
    IBV_EVENT_SQ_DRAINED,
    IBV_EVENT_PATH_MIG,
    IBV_EVENT_PATH_MIG_ERR,
    IBV_EVENT_DEVICE_FATAL,
    IBV_EVENT_PORT_ACTIVE,
    IBV_EVENT_PORT_ERR,
    IBV_EVENT_LID_CHANGE,
    IBV_EVENT_PKEY_CHANGE,
    IBV_EVENT_SM_CHANGE,
    IBV_EVENT_SRQ_ERR,
    IBV_EVENT_SRQ_LIMIT_REACHED,
    IBV_EVENT_QP_LAST_WQE_REACHED,
    IBV_EVENT_CLIENT_REREGISTER,
    IBV_EVENT_GID_CHANGE,
    IBV_EVENT_WQ_FATAL,
};

struct async_event {
    union {
        struct cq *cq;
        struct qp *qp;
        struct srq *srq;
        struct wq *wq;
        int port_num;
    } element;
    enum event_type event_type;
};

enum wc_status : int {
    IBV_WC_SUCCESS,
    IBV_WC_LOC_LEN_ERR,
    IBV_WC_LOC_QP_OP_ERR,
    IBV_WC_LOC_EEC_OP_ERR,
    IBV_WC_LOC_PROT_ERR,
    IBV_WC_WR_FLUSH_ERR,
    IBV_WC_MW_BIND_ERR,
    IBV_WC_BAD_RESP_ERR,
    IBV_WC_LOC_ACCESS_ERR,
    IBV_WC_REM_INV_REQ_ERR,
    IBV_WC_REM_ACCESS_ERR,
    IBV_WC_REM_OP_ERR,
    IBV_WC_RETRY_EXC_ERR,
    IBV_WC_RNR_RETRY_EXC_ERR,
    IBV_WC_LOC_RDD_VIOL_ERR,
    IBV_WC_REM_INV_RD_REQ_ERR,
    IBV_WC_REM_ABORT_ERR,
    IBV_WC_INV_EECN_ERR,
    IBV_WC_INV_EEC_STATE_ERR,
    IBV_WC_FATAL_ERR,
    IBV_WC_RESP_TIMEOUT_ERR,
    IBV_WC_GENERAL_ERR,
};

enum wc_opcode : int {
    IBV_WC_SEND = 0,
    IBV_WC_RDMA_WRITE = 1,
    IBV_WC_RDMA_READ = 2,
    IBV_WC_COMP_SWAP = 3,
    IBV_WC_FETCH_ADD = 4,
    IBV_WC_RECV = 1 << 7,
    IBV_WC_RECV_RDMA_WITH_IMM = (1 << 7) + 1,
};

struct wc {
    uint64_t wr_id;
    wc_status status;
    wc_opcode opcode;
    uint32_t vendor_err;
    uint32_t byte_len;
    union {
        uint32_t imm_data;  // big endian
        uint32_t invalidated_rkey;
    };
    uint32_t qp_num;
    uint32_t src_qp;
    unsigned int wc_flags;
    uint16_t pkey_index;
    uint16_t slid;
    uint8_t sl;
    uint8_t dlid_path_bits;
};

enum access_flags : int {
    IBV_ACCESS_LOCAL_WRITE = 1,
    IBV_ACCESS_REMOTE_WRITE = 1 << 1,
    IBV_ACCESS_REMOTE_READ = 1 << 2,
    IBV_ACCESS_REMOTE_ATOMIC = 1 << 3,
    // Optional flags (bits 20..29) are silently ignored by libraries and
    // devices that do not know them, but only through ibv_reg_mr_iova2:
    // the old ibv_reg_mr entry point rejects them.
    IBV_ACCESS_RELAXED_ORDERING = 1 << 20,
};
enum : unsigned int { IBV_ACCESS_OPTIONAL_RANGE = 0x3ff00000u };

struct pd {
    struct context *context;
    uint32_t handle;
};

struct mr {
    struct context *context;
    struct pd *pd;
    void *addr;
    size_t length;
    uint32_t handle;
    uint32_t lkey;
    uint32_t rkey;
};

struct global_route {
    gid dgid;
    uint32_t flow_label;
    uint8_t sgid_index;
    uint8_t hop_limit;
    uint8_t traffic_class;
};

struct ah_attr {
    global_route grh;
    uint16_t dlid;
    uint8_t sl;
    uint8_t src_path_bits;
    uint8_t static_rate;
    uint8_t is_global;
    uint8_t port_num;
};

enum qp_type : int {
    IBV_QPT_RC = 2,
    IBV_QPT_UC = 3,
    IBV_QPT_UD = 4,
};

struct qp_cap {
    uint32_t max_send_wr;
    uint32_t max_recv_wr;
    uint32_t max_send_sge;
    uint32_t max_recv_sge;
    uint32_t max_inline_data;
};

struct qp_init_attr {
    void *qp_context;
    cq *send_cq;
    cq *recv_cq;
    struct srq *srq;
    qp_cap cap;
    enum qp_type qp_type;
    int sq_sig_all;
};

enum qp_attr_mask : int {
    IBV_QP_STATE = 1 << 0,
    IBV_QP_CUR_STATE = 1 << 1,
    IBV_QP_EN_SQD_ASYNC_NOTIFY = 1 << 2,
    IBV_QP_ACCESS_FLAGS = 1 << 3,
    IBV_QP_PKEY_INDEX = 1 << 4,
    IBV_QP_PORT = 1 << 5,
    IBV_QP_QKEY = 1 << 6,
    IBV_QP_AV = 1 << 7,
    IBV_QP_PATH_MTU = 1 << 8,
    IBV_QP_TIMEOUT = 1 << 9,
    IBV_QP_RETRY_CNT = 1 << 10,
    IBV_QP_RNR_RETRY = 1 << 11,
    IBV_QP_RQ_PSN = 1 << 12,
    IBV_QP_MAX_QP_RD_ATOMIC = 1 << 13,
    IBV_QP_ALT_PATH = 1 << 14,
    IBV_QP_MIN_RNR_TIMER = 1 << 15,
    IBV_QP_SQ_PSN = 1 << 16,
    IBV_QP_MAX_DEST_RD_ATOMIC = 1 << 17,
    IBV_QP_PATH_MIG_STATE = 1 << 18,
    IBV_QP_CAP = 1 << 19,
    IBV_QP_DEST_QPN = 1 << 20,
    IBV_QP_RATE_LIMIT = 1 << 25,
};

enum qp_state : int {
    IBV_QPS_RESET,
    IBV_QPS_INIT,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_QPS_SQE,
    IBV_QPS_ERR,
    IBV_QPS_UNKNOWN,
};

enum mig_state : int { IBV_MIG_MIGRATED, IBV_MIG_REARM, IBV_MIG_ARMED };

struct qp_attr {
    enum qp_state qp_state;
    enum qp_state cur_qp_state;
    mtu path_mtu;
    mig_state path_mig_state;
    uint32_t qkey;
    uint32_t rq_psn;
    uint32_t sq_psn;
    uint32_t dest_qp_num;
    unsigned int qp_access_flags;
    qp_cap cap;
    struct ah_attr ah_attr;
    struct ah_attr alt_ah_attr;
    uint16_t pkey_index;
    uint16_t alt_pkey_index;
    uint8_t en_sqd_async_notify;
    uint8_t sq_draining;
    uint8_t max_rd_atomic;
    uint8_t max_dest_rd_atomic;
    uint8_t min_rnr_timer;
    uint8_t port_num;
    uint8_t timeout;
    uint8_t retry_cnt;
    uint8_t rnr_retry;
    uint8_t alt_port_num;
    uint8_t alt_timeout;
    uint32_t rate_limit;
};

enum wr_opcode : int {
    IBV_WR_RDMA_WRITE = 0,
    IBV_WR_RDMA_WRITE_WITH_IMM = 1,
    IBV_WR_SEND = 2,
    IBV_WR_SEND_WITH_IMM = 3,
    IBV_WR_RDMA_READ = 4,
    IBV_WR_ATOMIC_CMP_AND_SWP = 5,
    IBV_WR_ATOMIC_FETCH_AND_ADD = 6,
};

enum send_flags : int {
    IBV_SEND_FENCE = 1 << 0,
    IBV_SEND_SIGNALED = 1 << 1,
    IBV_SEND_SOLICITED = 1 << 2,
    IBV_SEND_INLINE = 1 << 3,
};

struct sge {
    uint64_t addr;
    uint32_t length;
    uint32_t lkey;
};

struct mw_bind_info {
    struct mr *mr;
    uint64_t addr;
    uint64_t length;
    unsigned int mw_access_flags;
};

struct send_wr {
    uint64_t wr_id;
    send_wr *next;
    sge *sg_list;
    int num_sge;
    wr_opcode opcode;
    unsigned int send_flags;
    union {
        uint32_t imm_data;  // big endian
        uint32_t invalidate_rkey;
    };
    union {
        struct {
            uint64_t remote_addr;
            uint32_t rkey;
        } rdma;
        struct {
            uint64_t remote_addr;
            uint64_t compare_add;
            uint64_t swap;
            uint32_t rkey;
        } atomic;
        struct {
            struct ah *ah;
            uint32_t remote_qpn;
            uint32_t remote_qkey;
        } ud;
    } wr;
    union {
        struct {
            uint32_t remote_srqn;
        } xrc;
    } qp_type;
    union {
        struct {
            struct mw *mw;
            uint32_t rkey;
            mw_bind_info bind_info;
        } bind_mw;
        struct {
            void *hdr;
            uint16_t hdr_sz;
            uint16_t mss;
        } tso;
    };
};

struct recv_wr {
    uint64_t wr_id;
    recv_wr *next;
    sge *sg_list;
    int num_sge;
};

struct qp {
    struct context *context;
    void *qp_context;
    struct pd *pd;
    struct cq *send_cq;
    struct cq *recv_cq;
    struct srq *srq;
    uint32_t handle;
    uint32_t qp_num;
    enum qp_state state;
    enum qp_type qp_type;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    uint32_t events_completed;
};

struct comp_channel {
    struct context *context;
    int fd;
    int refcnt;
};

struct cq {
    struct context *context;
    comp_channel *channel;
    void *cq_context;
    uint32_t handle;
    int cqe;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    uint32_t comp_events_completed;
    uint32_t async_events_completed;
};

// struct ibv_context_ops: the data-path verbs are inline functions in the
// real header that call through these slots, so the slot positions are ABI.
// Slots that only old libibverbs versions used are kept as placeholders.
using unused_fn = void (*)();
struct context_ops {
    unused_fn compat_query_device;
    unused_fn compat_query_port;
    unused_fn compat_alloc_pd;
    unused_fn compat_dealloc_pd;
    unused_fn compat_reg_mr;
    unused_fn compat_rereg_mr;
    unused_fn compat_dereg_mr;
    unused_fn alloc_mw;
    unused_fn bind_mw;
    unused_fn dealloc_mw;
    unused_fn compat_create_cq;
    int (*poll_cq)(cq *cq, int num_entries, wc *wc);
    int (*req_notify_cq)(cq *cq, int solicited_only);
    unused_fn compat_cq_event;
    unused_fn compat_resize_cq;
    unused_fn compat_destroy_cq;
    unused_fn compat_create_srq;
    unused_fn compat_modify_srq;
    unused_fn compat_query_srq;
    unused_fn compat_destroy_srq;
    unused_fn post_srq_recv;
    unused_fn compat_create_qp;
    unused_fn compat_query_qp;
    unused_fn compat_modify_qp;
    unused_fn compat_destroy_qp;
    int (*post_send)(qp *qp, send_wr *wr, send_wr **bad_wr);
    int (*post_recv)(qp *qp, recv_wr *wr, recv_wr **bad_wr);
    unused_fn compat_create_ah;
    unused_fn compat_destroy_ah;
    unused_fn compat_attach_mcast;
    unused_fn compat_detach_mcast;
    unused_fn compat_async_event;
};

struct context {
    struct device *device;
    context_ops ops;
    int cmd_fd;
    int async_fd;
    int num_comp_vectors;
    pthread_mutex_t mutex;
    void *abi_compat;
};

// The data-path verbs, dispatched exactly like the real static inline
// ibv_post_send/ibv_post_recv/ibv_poll_cq/ibv_req_notify_cq.
inline int post_send(qp *q, send_wr *wr, send_wr **bad_wr) {
    return q->context->ops.post_send(q, wr, bad_wr);
}
inline int post_recv(qp *q, recv_wr *wr, recv_wr **bad_wr) {
    return q->context->ops.post_recv(q, wr, bad_wr);
}
inline int poll_cq(cq *c, int num_entries, wc *out) {
    return c->context->ops.poll_cq(c, num_entries, out);
}
inline int req_notify_cq(cq *c, int solicited_only) {
    return c->context->ops.req_notify_cq(c, solicited_only);
}

}  // namespace ibv
}  // namespace mcrs
