#include "common/log.h"
#include "core/config.h"
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
    CopyBatch batch;
    // The GPU the gather kernel runs on for this ring's copies, or -1 (copy
    // engines only): set when the pinned halves are mapped into the GPU's
    // address space at the same address, as unified addressing does.
    int gather = -1;
    std::string failed;      // why setting up failed (not retried)
    cudaError_t pending = cudaSuccess;  // a failed early flush, reported by issue()

    ~Impl() {
        if (stream) cudaStreamSynchronize(stream);
        for (auto e : ev)
            if (e) cudaEventDestroy(e);
        if (buf) cudaFreeHost(buf);
        if (stream) cudaStreamDestroy(stream);
    }
};

namespace {
bool kernel_wanted() {
    static const bool v = gpu_stage_kernel_from_env();
    return v;
}

bool failed(cudaError_t e, const char *what, std::string &err) {
    cudaGetLastError();
    err = std::string(what) + ": " + cudaGetErrorString(e);
    return false;
}
}  // namespace

StageRing::StageRing() = default;
StageRing::~StageRing() = default;

bool StageRing::ready(int device, std::string &err) {
    if (impl_) {
        if (!impl_->failed.empty()) {
            err = impl_->failed;
            return false;
        }
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
    im->batch.exempt(im->buf, 2 * kHalfBytes);
    if (e == cudaSuccess && kernel_wanted()) {
        // Small pieces between the halves and GPU memory then go as one
        // kernel launch: a copy engine pays microseconds per copy, which a
        // scattered KV transfer of 32 KiB blocks pays once per block.
        cudaPointerAttributes a{};
        if (cudaPointerGetAttributes(&a, im->buf) == cudaSuccess && a.type == cudaMemoryTypeHost &&
            a.devicePointer == im->buf)
            im->gather = device;
        else
            cudaGetLastError();
    }
    impl_ = std::move(im);
    if (e == cudaSuccess) return true;
    // A ring that cannot be set up stays unusable: no retry per request.
    failed(e, "cannot set up GPU staging", impl_->failed);
    MC_LOG(Warn, "GPU staging for batches of small requests: " << impl_->failed << "; using the unbatched path");
    err = impl_->failed;
    return false;
}

char *StageRing::half(int h) const { return impl_->buf + (h ? kHalfBytes : 0); }

void StageRing::queue(void *dst, const void *src, size_t n) {
    Impl &m = *impl_;
    if (m.batch.add(dst, src, n)) return;
    // It depends on a gathered copy: queue those first (stream order).
    cudaSetDevice(m.device);
    cudaError_t e = m.batch.flush(m.stream, m.gather);
    if (e != cudaSuccess && m.pending == cudaSuccess) m.pending = e;
    m.batch.add(dst, src, n);
}

size_t StageRing::queued_bytes() const { return impl_ ? impl_->batch.bytes() : 0; }

bool StageRing::issue(int h, std::string &err) {
    Impl &m = *impl_;
    cudaSetDevice(m.device);
    cudaError_t e = m.batch.flush(m.stream, m.gather);
    if (m.pending != cudaSuccess) {
        e = m.pending;
        m.pending = cudaSuccess;
    }
    if (e == cudaSuccess) e = cudaEventRecord(m.ev[h], m.stream);
    if (e != cudaSuccess) {
        cudaStreamSynchronize(m.stream);  // nothing may still use a half
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
