#include "transport/rdma/verbs_loader.h"

#include <dlfcn.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "common/text.h"
#include "core/config.h"
#include "common/error.h"
#include "common/log.h"

namespace mcrs {
namespace ibv {

namespace {

constexpr const char *kDefaultLibrary = "libibverbs.so.1";

// libibverbs exports most verbs twice: IBVERBS_1.0 (the pre-2006 ABI with
// different structs) and IBVERBS_1.1. Ask for 1.1 explicitly; symbols that
// only exist in one version (or libraries without symbol versions, like the
// softverbs stand-in) are found by the plain lookup.
void *find_symbol(void *handle, const char *name) {
    void *p = dlvsym(handle, name, "IBVERBS_1.1");
    if (!p) p = dlsym(handle, name);
    return p;
}

template <class F>
void resolve(void *handle, const std::string &path, const char *name, F &fn, bool required) {
    fn = reinterpret_cast<F>(find_symbol(handle, name));
    if (!fn && required) {
        const char *why = dlerror();
        throw Error(kErrContext, "RDMA was requested but the verbs library '" + path +
                                     "' lacks the required symbol " + name + " (" +
                                     (why ? why : "not found") +
                                     "); it is not a usable libibverbs (install rdma-core's "
                                     "libibverbs1, or point MC_VERBS_LIBRARY at one)");
    }
}

std::string load_failure(const std::string &path, const char *why) {
    return "RDMA was requested but the verbs library '" + path + "' could not be loaded (" +
           std::string(why ? why : "unknown dlopen error") +
           "). Install rdma-core (Debian/Ubuntu: apt-get install libibverbs1 ibverbs-providers; "
           "RHEL/Fedora: dnf install libibverbs rdma-core), set MC_VERBS_LIBRARY to the path of "
           "libibverbs.so.1, or use protocol \"tcp\" instead of \"rdma\".";
}

struct Slot {
    std::unique_ptr<VerbsLibrary> lib;
    std::string error;
};

}  // namespace

// Fills a VerbsLibrary; a struct so the private constructor stays private.
struct VerbsLibraryOpener {
    static std::unique_ptr<VerbsLibrary> open(const std::string &path) {
        std::unique_ptr<VerbsLibrary> lib(new VerbsLibrary());
        lib->path_ = path;
        dlerror();
        void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!h) throw Error(kErrContext, load_failure(path, dlerror()));
        lib->handle_ = h;
        VerbsApi &a = lib->api_;
        resolve(h, path, "ibv_get_device_list", a.get_device_list, true);
        resolve(h, path, "ibv_free_device_list", a.free_device_list, true);
        resolve(h, path, "ibv_get_device_name", a.get_device_name, true);
        resolve(h, path, "ibv_open_device", a.open_device, true);
        resolve(h, path, "ibv_close_device", a.close_device, true);
        resolve(h, path, "ibv_query_device", a.query_device, true);
        resolve(h, path, "ibv_query_port", a.query_port_export, true);
        resolve(h, path, "ibv_query_gid", a.query_gid, true);
        resolve(h, path, "ibv_alloc_pd", a.alloc_pd, true);
        resolve(h, path, "ibv_dealloc_pd", a.dealloc_pd, true);
        resolve(h, path, "ibv_reg_mr", a.reg_mr, true);
        resolve(h, path, "ibv_reg_mr_iova2", a.reg_mr_iova2, false);
        resolve(h, path, "ibv_reg_dmabuf_mr", a.reg_dmabuf_mr, false);
        resolve(h, path, "ibv_dereg_mr", a.dereg_mr, true);
        resolve(h, path, "ibv_create_comp_channel", a.create_comp_channel, true);
        resolve(h, path, "ibv_destroy_comp_channel", a.destroy_comp_channel, true);
        resolve(h, path, "ibv_create_cq", a.create_cq, true);
        resolve(h, path, "ibv_destroy_cq", a.destroy_cq, true);
        resolve(h, path, "ibv_get_cq_event", a.get_cq_event, true);
        resolve(h, path, "ibv_ack_cq_events", a.ack_cq_events, true);
        resolve(h, path, "ibv_create_qp", a.create_qp, true);
        resolve(h, path, "ibv_modify_qp", a.modify_qp, true);
        resolve(h, path, "ibv_query_qp", a.query_qp, true);
        resolve(h, path, "ibv_destroy_qp", a.destroy_qp, true);
        resolve(h, path, "ibv_get_async_event", a.get_async_event, true);
        resolve(h, path, "ibv_ack_async_event", a.ack_async_event, true);
        resolve(h, path, "ibv_fork_init", a.fork_init, false);
        MC_LOG(Info, "rdma: loaded verbs library " << path << " (reg_mr_iova2: "
                                                   << (a.reg_mr_iova2 ? "yes" : "no")
                                                   << ", dmabuf: "
                                                   << (a.reg_dmabuf_mr ? "yes" : "no") << ")");
        return lib;
    }
};

std::string VerbsLibrary::resolve_path(const std::string &explicit_path) {
    if (!explicit_path.empty()) return explicit_path;
    std::string env = verbs_library_from_env();
    return env.empty() ? kDefaultLibrary : env;
}

const VerbsLibrary &VerbsLibrary::load(const std::string &explicit_path) {
    static std::mutex mu;
    static std::map<std::string, Slot> *slots = new std::map<std::string, Slot>();  // never freed
    std::string path = resolve_path(explicit_path);
    std::lock_guard<std::mutex> lock(mu);
    Slot &slot = (*slots)[path];
    if (!slot.lib && slot.error.empty()) {
        try {
            slot.lib = VerbsLibraryOpener::open(path);
        } catch (const Error &e) {
            // A failed dlopen/dlsym leaves the handle open; that is harmless
            // and keeps a library with unresolved symbols from unloading.
            slot.error = e.what();
            MC_LOG(Warn, "rdma: " << slot.error);
        }
    }
    if (!slot.lib) throw Error(kErrContext, slot.error);
    return *slot.lib;
}

int VerbsLibrary::query_port(context *ctx, uint8_t port, port_attr *attr) const {
    std::memset(attr, 0, sizeof(*attr));
    return api_.query_port_export(ctx, port, attr);
}

mr *VerbsLibrary::reg_mr(pd *p, void *addr, size_t length, int access) const {
    if (api_.reg_mr_iova2)
        return api_.reg_mr_iova2(p, addr, length, reinterpret_cast<uintptr_t>(addr),
                                 static_cast<unsigned int>(access));
    return api_.reg_mr(p, addr, length, access & ~static_cast<int>(IBV_ACCESS_OPTIONAL_RANGE));
}

mr *VerbsLibrary::reg_dmabuf_mr(pd *p, uint64_t offset, size_t length, uint64_t iova, int fd,
                                int access) const {
    if (!api_.reg_dmabuf_mr) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    return api_.reg_dmabuf_mr(p, offset, length, iova, fd, access);
}

void *VerbsLibrary::symbol(const char *name) const { return dlsym(handle_, name); }

const char *wc_status_name(int status) {
    static const char *const names[] = {
        "IBV_WC_SUCCESS",          "IBV_WC_LOC_LEN_ERR",        "IBV_WC_LOC_QP_OP_ERR",
        "IBV_WC_LOC_EEC_OP_ERR",   "IBV_WC_LOC_PROT_ERR",       "IBV_WC_WR_FLUSH_ERR",
        "IBV_WC_MW_BIND_ERR",      "IBV_WC_BAD_RESP_ERR",       "IBV_WC_LOC_ACCESS_ERR",
        "IBV_WC_REM_INV_REQ_ERR",  "IBV_WC_REM_ACCESS_ERR",     "IBV_WC_REM_OP_ERR",
        "IBV_WC_RETRY_EXC_ERR",    "IBV_WC_RNR_RETRY_EXC_ERR",  "IBV_WC_LOC_RDD_VIOL_ERR",
        "IBV_WC_REM_INV_RD_REQ_ERR", "IBV_WC_REM_ABORT_ERR",    "IBV_WC_INV_EECN_ERR",
        "IBV_WC_INV_EEC_STATE_ERR", "IBV_WC_FATAL_ERR",         "IBV_WC_RESP_TIMEOUT_ERR",
        "IBV_WC_GENERAL_ERR",
    };
    if (status < 0 || status >= static_cast<int>(sizeof(names) / sizeof(names[0])))
        return "IBV_WC_(unknown)";
    return names[status];
}

const char *qp_state_name(int state) {
    static const char *const names[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
    if (state < 0 || state >= static_cast<int>(sizeof(names) / sizeof(names[0]))) return "UNKNOWN";
    return names[state];
}

const char *event_type_name(int type) {
    static const char *const names[] = {
        "IBV_EVENT_CQ_ERR",        "IBV_EVENT_QP_FATAL",          "IBV_EVENT_QP_REQ_ERR",
        "IBV_EVENT_QP_ACCESS_ERR", "IBV_EVENT_COMM_EST",          "IBV_EVENT_SQ_DRAINED",
        "IBV_EVENT_PATH_MIG",      "IBV_EVENT_PATH_MIG_ERR",      "IBV_EVENT_DEVICE_FATAL",
        "IBV_EVENT_PORT_ACTIVE",   "IBV_EVENT_PORT_ERR",          "IBV_EVENT_LID_CHANGE",
        "IBV_EVENT_PKEY_CHANGE",   "IBV_EVENT_SM_CHANGE",         "IBV_EVENT_SRQ_ERR",
        "IBV_EVENT_SRQ_LIMIT_REACHED", "IBV_EVENT_QP_LAST_WQE_REACHED",
        "IBV_EVENT_CLIENT_REREGISTER", "IBV_EVENT_GID_CHANGE",    "IBV_EVENT_WQ_FATAL",
    };
    if (type < 0 || type >= static_cast<int>(sizeof(names) / sizeof(names[0])))
        return "IBV_EVENT_(unknown)";
    return names[type];
}

}  // namespace ibv
}  // namespace mcrs
