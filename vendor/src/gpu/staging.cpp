// TCP with device memory: bytes move between the socket and GPU memory
// through two pinned host buffers per thread, so the copy engine works on
// chunk i+1 while the socket moves chunk i.
#include <cerrno>
#include <map>
#include <memory>

#include "core/config.h"
#include "common/log.h"
#include "gpu/cuda_api.h"
#include "gpu/gpu.h"

namespace mcrs {
namespace gpu {

#if MC_WITH_CUDA

namespace {

// Pipeline chunk: small enough that a 4 MiB request has several chunks
// in flight (copy engine and socket overlap inside one request), large
// enough that the per-chunk event wait stays cheap. MC_GPU_STAGE_CHUNK_KIB
// overrides it (64 KiB .. 16 MiB).
size_t chunk_bytes() {
    static const size_t v = gpu_stage_chunk_bytes_from_env();
    return v;
}

struct Stager {
    int device = -1;
    cudaStream_t stream = nullptr;
    void *buf[2] = {nullptr, nullptr};
    cudaEvent_t ev[2] = {nullptr, nullptr};
    bool ok = false;
    std::string error;

    const size_t kChunk = chunk_bytes();
    explicit Stager(int dev) : device(dev) {
        cudaSetDevice(dev);
        cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        for (int i = 0; i < 2 && e == cudaSuccess; ++i) {
            e = cudaMallocHost(&buf[i], kChunk);
            if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming);
        }
        ok = e == cudaSuccess;
        if (!ok) error = std::string("cannot set up GPU staging: ") + cudaGetErrorString(e);
    }
    ~Stager() {
        for (int i = 0; i < 2; ++i) {
            if (ev[i]) cudaEventDestroy(ev[i]);
            if (buf[i]) cudaFreeHost(buf[i]);
        }
        if (stream) cudaStreamDestroy(stream);
    }
};

Stager *stager_for(int device, std::string &err) {
    thread_local std::map<int, std::unique_ptr<Stager>> stagers;
    auto &s = stagers[device];
    if (!s) s = std::make_unique<Stager>(device);
    if (!s->ok) {
        err = s->error;
        return nullptr;
    }
    cudaSetDevice(device);
    return s.get();
}

IoResult cuda_failure(cudaError_t e, const char *what, std::string &err) {
    err = std::string(what) + ": " + cudaGetErrorString(e);
    IoResult r;
    r.status = IoStatus::Error;
    r.err = EIO;
    return r;
}

}  // namespace

IoResult send_from_device(int fd, const void *dev, size_t n, int device, std::string &err) {
    Stager *s = stager_for(device, err);
    if (!s) return cuda_failure(cudaErrorInvalidValue, "GPU staging", err);
    const size_t kChunk = s->kChunk;
    const char *src = static_cast<const char *>(dev);
    size_t chunks = (n + kChunk - 1) / kChunk;
    auto len_of = [&](size_t i) { return i + 1 < chunks ? kChunk : n - i * kChunk; };
    cudaError_t e = cudaMemcpyAsync(s->buf[0], src, len_of(0), cudaMemcpyDeviceToHost, s->stream);
    if (e == cudaSuccess) e = cudaEventRecord(s->ev[0], s->stream);
    if (e != cudaSuccess) return cuda_failure(e, "copying from the GPU", err);
    size_t sent = 0;
    for (size_t i = 0; i < chunks; ++i) {
        int b = static_cast<int>(i % 2);
        e = cudaEventSynchronize(s->ev[b]);
        if (e == cudaSuccess && i + 1 < chunks) {
            int nb = 1 - b;
            e = cudaMemcpyAsync(s->buf[nb], src + (i + 1) * kChunk, len_of(i + 1), cudaMemcpyDeviceToHost, s->stream);
            if (e == cudaSuccess) e = cudaEventRecord(s->ev[nb], s->stream);
        }
        if (e != cudaSuccess) {
            cudaStreamSynchronize(s->stream);
            return cuda_failure(e, "copying from the GPU", err);
        }
        IoResult io = send_all(fd, s->buf[b], len_of(i));
        sent += io.done;
        if (!io.ok()) {
            cudaStreamSynchronize(s->stream);  // the next chunk's copy may still be running
            io.done = sent;
            return io;
        }
    }
    IoResult r;
    r.done = sent;
    return r;
}

IoResult recv_into_device(int fd, void *dev, size_t n, int device, std::string &err) {
    Stager *s = stager_for(device, err);
    if (!s) return cuda_failure(cudaErrorInvalidValue, "GPU staging", err);
    const size_t kChunk = s->kChunk;
    char *dst = static_cast<char *>(dev);
    size_t chunks = (n + kChunk - 1) / kChunk;
    size_t got = 0;
    for (size_t i = 0; i < chunks; ++i) {
        int b = static_cast<int>(i % 2);
        size_t len = i + 1 < chunks ? kChunk : n - i * kChunk;
        cudaError_t e = i >= 2 ? cudaEventSynchronize(s->ev[b]) : cudaSuccess;
        if (e != cudaSuccess) {
            cudaStreamSynchronize(s->stream);
            return cuda_failure(e, "copying to the GPU", err);
        }
        IoResult io = recv_all(fd, s->buf[b], len);
        got += io.done;
        if (!io.ok()) {
            cudaStreamSynchronize(s->stream);
            io.done = got;
            return io;
        }
        e = cudaMemcpyAsync(dst + i * kChunk, s->buf[b], len, cudaMemcpyHostToDevice, s->stream);
        if (e == cudaSuccess) e = cudaEventRecord(s->ev[b], s->stream);
        if (e != cudaSuccess) {
            cudaStreamSynchronize(s->stream);
            return cuda_failure(e, "copying to the GPU", err);
        }
    }
    // The bytes are in device memory before anyone is told they arrived.
    cudaError_t e = cudaStreamSynchronize(s->stream);
    if (e != cudaSuccess) return cuda_failure(e, "copying to the GPU", err);
    IoResult r;
    r.done = got;
    return r;
}

#else

IoResult send_from_device(int, const void *, size_t, int, std::string &err) {
    err = status().reason;
    IoResult r;
    r.status = IoStatus::Error;
    r.err = ENOTSUP;
    return r;
}

IoResult recv_into_device(int, void *, size_t, int, std::string &err) {
    err = status().reason;
    IoResult r;
    r.status = IoStatus::Error;
    r.err = ENOTSUP;
    return r;
}

#endif

}  // namespace gpu
}  // namespace mcrs
