// The subset of the CUDA runtime API the engine uses, declared here because
// the PyPI runtime packages (nvidia-cuda-runtime-cu12 / nvidia-cuda-runtime)
// ship cuda_runtime_api.h without the crt/ headers it includes. Names,
// signatures, enum values and struct layouts are NVIDIA's (stable across
// CUDA 12 and 13); the functions come from libcudart_static.a. Driver API
// types come from cuda.h, which is self-contained. Only compiled with CUDA.
#pragma once

#if MC_WITH_CUDA

#include <cuda.h>
#include <stddef.h>

extern "C" {

typedef int cudaError_t;  // enum cudaError
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorInsufficientDriver = 35,
    cudaErrorCallRequiresNewerDriver = 36,
    cudaErrorNoDevice = 100,
    cudaErrorNotReady = 600,
    cudaErrorNotSupported = 801,
    cudaErrorPeerAccessAlreadyEnabled = 704,
};

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
// The runtime's per-thread default stream handle (a fixed value of the ABI).
#define cudaStreamPerThread (reinterpret_cast<cudaStream_t>(0x2))

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3,
};

// CUDA 12 ends the struct after hostPointer (24 bytes); CUDA 13 appends a
// union and `long reserved[7]` (88 bytes). The padding gives the runtime of
// either major the room it writes into.
struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer;
    void *hostPointer;
    long mc_padding[16];
};

typedef struct cudaIpcMemHandle_st {
    char reserved[64];
} cudaIpcMemHandle_t;

#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02
#define cudaIpcMemLazyEnablePeerAccess 0x01

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaDriverGetVersion(int *version);
cudaError_t cudaRuntimeGetVersion(int *version);
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);
cudaError_t cudaGetLastError(void);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemset(void *ptr, int value, size_t count);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr);
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr);
cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags);
cudaError_t cudaIpcCloseMemHandle(void *devPtr);
cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice);
cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags);
cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t count);
cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                                cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);

// Kernels from PTX text (runtime 12.0 and later; see gather_kernel.cpp).
// Enum arguments are passed as int-sized values; only null/zero counts are
// used.
typedef struct CUlib_st *cudaLibrary_t;
typedef struct CUkern_st *cudaKernel_t;
struct dim3 {
    unsigned int x, y, z;
};
cudaError_t cudaLibraryLoadData(cudaLibrary_t *library, const void *code, int *jitOptions, void **jitOptionsValues,
                                unsigned int numJitOptions, int *libraryOptions, void **libraryOptionValues,
                                unsigned int numLibraryOptions);
cudaError_t cudaLibraryGetKernel(cudaKernel_t *kernel, cudaLibrary_t library, const char *name);
cudaError_t cudaLaunchKernel(const void *func, struct dim3 gridDim, struct dim3 blockDim, void **args,
                             size_t sharedMem, cudaStream_t stream);

// Batched copies (runtime 12.8 and later, see copy_batch.cpp; the driver
// must support them too, else the call fails and the engine copies one by
// one). The
// attribute struct is 24 bytes in CUDA 12 and 13 (cudaMemLocation is an
// enum and an int-sized union in both).
enum cudaMemcpySrcAccessOrder {
    cudaMemcpySrcAccessOrderInvalid = 0,
    cudaMemcpySrcAccessOrderStream = 1,
};
struct cudaMemLocation {
    int type;
    int id;
};
struct cudaMemcpyAttributes {
    enum cudaMemcpySrcAccessOrder srcAccessOrder;
    struct cudaMemLocation srcLocHint;
    struct cudaMemLocation dstLocHint;
    unsigned int flags;
};
#if MC_CUDA_MAJOR >= 13
cudaError_t cudaMemcpyBatchAsync(void *const *dsts, const void *const *srcs, const size_t *sizes, size_t count,
                                 struct cudaMemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
                                 cudaStream_t stream);
#else
cudaError_t cudaMemcpyBatchAsync(void **dsts, void **srcs, size_t *sizes, size_t count,
                                 struct cudaMemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
                                 size_t *failIdx, cudaStream_t stream);
#endif

}  // extern "C"

#endif  // MC_WITH_CUDA
