#include <vector>

#include "common/log.h"
#include "gpu/copy_batch.h"
#include "gpu/cuda_api.h"
#include "gpu/gpu.h"

namespace mcrs {
namespace gpu {

#if MC_WITH_CUDA

struct StageRing::Impl {
    int device = -1;
    char *buf = nullptr;  // 2 * kHalfBytes, pinned
    cudaStream_t stream = nullptr;
    cudaEvent_t ev[2] = {nullptr, nullptr};
    std::vector<void *> dst;
    std::vector<const void *> src;
    std::vector<size_t> len;
    size_t bytes = 0;

    ~Impl() {
        if (stream) cudaStreamSynchronize(stream);
        for (auto e : ev)
            if (e) cudaEventDestroy(e);
        if (buf) cudaFreeHost(buf);
        if (stream) cudaStreamDestroy(stream);
    }
};

namespace {
bool failed(cudaError_t e, const char *what, std::string &err) {
    cudaGetLastError();
    err = std::string(what) + ": " + cudaGetErrorString(e);
    return false;
}
}  // namespace

StageRing::StageRing() = default;
StageRing::~StageRing() = default;

bool StageRing::ready(int device, std::string &err) {
    if (impl_ && impl_->buf) {
        if (impl_->device == device) return true;
        err = "staging ring serves GPU " + std::to_string(impl_->device);
        return false;
    }
    if (!status().usable) {
        err = status().reason;
        return false;
    }
    auto im = std::make_unique<Impl>();
    im->device = device;
    cudaSetDevice(device);
    cudaError_t e = cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking);
    void *p = nullptr;
    if (e == cudaSuccess) e = cudaMallocHost(&p, 2 * kHalfBytes);
    im->buf = static_cast<char *>(p);
    for (int i = 0; i < 2 && e == cudaSuccess; ++i) e = cudaEventCreateWithFlags(&im->ev[i], cudaEventDisableTiming);
    if (e != cudaSuccess) return failed(e, "cannot set up GPU staging", err);
    im->dst.reserve(256);
    im->src.reserve(256);
    im->len.reserve(256);
    impl_ = std::move(im);
    return true;
}

char *StageRing::half(int h) const { return impl_->buf + (h ? kHalfBytes : 0); }

void StageRing::queue(void *dst, const void *src, size_t n) {
    Impl &m = *impl_;
    if (!m.len.empty() && static_cast<char *>(m.dst.back()) + m.len.back() == dst &&
        static_cast<const char *>(m.src.back()) + m.len.back() == src) {
        m.len.back() += n;  // continues the previous piece on both sides
    } else {
        m.dst.push_back(dst);
        m.src.push_back(src);
        m.len.push_back(n);
    }
    m.bytes += n;
}

size_t StageRing::queued_bytes() const { return impl_ ? impl_->bytes : 0; }

bool StageRing::issue(int h, std::string &err) {
    Impl &m = *impl_;
    cudaError_t e = enqueue_copies(m.stream, m.dst.data(), m.src.data(), m.len.data(), m.len.size());
    m.dst.clear();
    m.src.clear();
    m.len.clear();
    m.bytes = 0;
    if (e == cudaSuccess) e = cudaEventRecord(m.ev[h], m.stream);
    if (e != cudaSuccess) {
        cudaStreamSynchronize(m.stream);  // nothing may still write a half
        return failed(e, "batched GPU staging copy", err);
    }
    return true;
}

bool StageRing::wait(int h, std::string &err) {
    cudaError_t e = cudaEventSynchronize(impl_->ev[h]);
    return e == cudaSuccess || failed(e, "batched GPU staging copy", err);
}

#else  // CPU build: ready() always says why not.

struct StageRing::Impl {};
StageRing::StageRing() = default;
StageRing::~StageRing() = default;
bool StageRing::ready(int, std::string &err) {
    err = status().reason;
    return false;
}
char *StageRing::half(int) const { return nullptr; }
void StageRing::queue(void *, const void *, size_t) {}
size_t StageRing::queued_bytes() const { return 0; }
bool StageRing::issue(int, std::string &) { return false; }
bool StageRing::wait(int, std::string &) { return false; }

#endif

}  // namespace gpu
}  // namespace mcrs
