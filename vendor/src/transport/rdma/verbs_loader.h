// Loads the verbs library at run time, as NCCL does, so the engine neither
// links against libibverbs nor needs rdma-core to build, and machines
// without RDMA only fail when RDMA is actually requested.
//
// Which library: the explicit path given to load(), else env
// MC_VERBS_LIBRARY, else "libibverbs.so.1". Tests point it at the
// software stand-in (vendor/softverbs, libmc_softverbs.so).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/rdma/verbs_abi.h"

namespace mcrs {
namespace ibv {

// The exported verbs entry points. Required ones are never null in a loaded
// library; optional ones are null when the library predates them.
struct VerbsApi {
    device **(*get_device_list)(int *num_devices) = nullptr;
    void (*free_device_list)(device **list) = nullptr;
    const char *(*get_device_name)(device *dev) = nullptr;
    context *(*open_device)(device *dev) = nullptr;
    int (*close_device)(context *ctx) = nullptr;
    int (*query_device)(context *ctx, device_attr *attr) = nullptr;
    // The exported ibv_query_port symbol (the real header wraps it in a
    // macro); call VerbsLibrary::query_port, which zeroes the output first.
    int (*query_port_export)(context *ctx, uint8_t port, port_attr *attr) = nullptr;
    int (*query_gid)(context *ctx, uint8_t port, int index, gid *out) = nullptr;
    pd *(*alloc_pd)(context *ctx) = nullptr;
    int (*dealloc_pd)(pd *p) = nullptr;
    mr *(*reg_mr)(pd *p, void *addr, size_t length, int access) = nullptr;
    mr *(*reg_mr_iova2)(pd *p, void *addr, size_t length, uint64_t iova,
                        unsigned int access) = nullptr;  // optional (libibverbs >= 1.8)
    mr *(*reg_dmabuf_mr)(pd *p, uint64_t offset, size_t length, uint64_t iova, int fd,
                         int access) = nullptr;  // optional (rdma-core >= 34)
    int (*dereg_mr)(mr *m) = nullptr;
    comp_channel *(*create_comp_channel)(context *ctx) = nullptr;
    int (*destroy_comp_channel)(comp_channel *ch) = nullptr;
    cq *(*create_cq)(context *ctx, int cqe, void *cq_context, comp_channel *ch,
                     int comp_vector) = nullptr;
    int (*destroy_cq)(cq *c) = nullptr;
    int (*get_cq_event)(comp_channel *ch, cq **c, void **cq_context) = nullptr;
    void (*ack_cq_events)(cq *c, unsigned int nevents) = nullptr;
    qp *(*create_qp)(pd *p, qp_init_attr *attr) = nullptr;
    int (*modify_qp)(qp *q, qp_attr *attr, int attr_mask) = nullptr;
    int (*query_qp)(qp *q, qp_attr *attr, int attr_mask, qp_init_attr *init) = nullptr;
    int (*destroy_qp)(qp *q) = nullptr;
    int (*get_async_event)(context *ctx, async_event *event) = nullptr;
    void (*ack_async_event)(async_event *event) = nullptr;
    int (*fork_init)() = nullptr;  // optional
};

class VerbsLibrary {
public:
    // The library for `path` (empty: MC_VERBS_LIBRARY, else libibverbs.so.1),
    // loaded once per path and kept for the life of the process (providers
    // do not survive dlclose). Thread-safe. Throws mcrs::Error(kErrContext)
    // when the library cannot be loaded or lacks a required symbol; the
    // failure is remembered, so later calls for that path throw the same.
    static const VerbsLibrary &load(const std::string &path = std::string());
    // The path load() would use for `explicit_path`.
    static std::string resolve_path(const std::string &explicit_path);

    const std::string &path() const { return path_; }
    const VerbsApi &api() const { return api_; }
    bool has_reg_mr_iova2() const { return api_.reg_mr_iova2 != nullptr; }
    bool has_dmabuf_mr() const { return api_.reg_dmabuf_mr != nullptr; }
    // Relaxed ordering can only be requested through ibv_reg_mr_iova2.
    bool supports_relaxed_ordering() const { return has_reg_mr_iova2(); }

    // ibv_query_port as the real inline wrapper does it: zeroed output, then
    // the exported symbol. Returns 0 or an errno value.
    int query_port(context *ctx, uint8_t port, port_attr *attr) const;
    // ibv_reg_mr as the real header's macro does it: through
    // ibv_reg_mr_iova2 (iova = addr) when present, else through ibv_reg_mr
    // with the optional access bits (RELAXED_ORDERING) dropped. Returns null
    // with errno set on failure.
    mr *reg_mr(pd *p, void *addr, size_t length, int access) const;
    // ibv_reg_dmabuf_mr; null with errno EOPNOTSUPP when the library has none.
    mr *reg_dmabuf_mr(pd *p, uint64_t offset, size_t length, uint64_t iova, int fd,
                      int access) const;
    // Any other symbol of the library (null if absent): tests resolve the
    // softverbs mc_softverbs_* control functions this way.
    void *symbol(const char *name) const;

    VerbsLibrary(const VerbsLibrary &) = delete;
    VerbsLibrary &operator=(const VerbsLibrary &) = delete;

private:
    VerbsLibrary() = default;
    friend struct VerbsLibraryOpener;
    std::string path_;
    void *handle_ = nullptr;
    VerbsApi api_;
};

// Short name of a work-completion status, e.g. "IBV_WC_REM_ACCESS_ERR".
const char *wc_status_name(int status);
// Name of a QP state, e.g. "RTS".
const char *qp_state_name(int state);
// Name of an async event type, e.g. "IBV_EVENT_PORT_ERR".
const char *event_type_name(int type);

}  // namespace ibv
}  // namespace mcrs
