// The runtime entry points the preload exports, for libraries linked against libcudart.so
// (PyTorch's libtorch_cuda.so, loaded RTLD_LOCAL after libtorch_global_deps.so put libcudart in
// the global scope): their PLT calls land here, and go on to the libcudart the caller itself
// would have bound to. Programs linking the runtime statically (NCCL) reach the driver hooks
// only, through cuGetProcAddress.
#include <cuda_runtime_api.h>

#include "interpose/hooks.h"
#include "interpose/plt_bindings.h"

#define TIDE_EXPORT extern "C" __attribute__((visibility("default")))

// NOLINTBEGIN(bugprone-macro-parentheses): `kind` is a qualified name
#define TIDE_CALLER_BINDING(symbol, kind)                                \
  [](void* return_address) -> tide::interpose::Binding& {                \
    static tide::interpose::PltSite site{symbol, tide::interpose::kind}; \
    return tide::interpose::caller_binding(site, return_address);        \
  }(__builtin_return_address(0))

#define TIDE_BODY(kind) tide::interpose::Entry<tide::interpose::kind>::body
// NOLINTEND(bugprone-macro-parentheses)

TIDE_EXPORT cudaError_t cudaMalloc(void** ptr, size_t size) {
  return TIDE_BODY(Kind::rt_malloc)(TIDE_CALLER_BINDING("cudaMalloc", Kind::rt_malloc), ptr, size);
}

TIDE_EXPORT cudaError_t cudaMallocPitch(void** ptr, size_t* pitch, size_t width, size_t height) {
  return TIDE_BODY(Kind::rt_malloc_pitch)(
      TIDE_CALLER_BINDING("cudaMallocPitch", Kind::rt_malloc_pitch), ptr, pitch, width, height);
}

TIDE_EXPORT cudaError_t cudaMallocManaged(void** ptr, size_t size, unsigned int flags) {
  return TIDE_BODY(Kind::rt_malloc_managed)(
      TIDE_CALLER_BINDING("cudaMallocManaged", Kind::rt_malloc_managed), ptr, size, flags);
}

TIDE_EXPORT cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  return TIDE_BODY(Kind::rt_malloc_async)(
      TIDE_CALLER_BINDING("cudaMallocAsync", Kind::rt_malloc_async), ptr, size, stream);
}

TIDE_EXPORT cudaError_t cudaMallocAsync_ptsz(void** ptr, size_t size, cudaStream_t stream) {
  return TIDE_BODY(Kind::rt_malloc_async)(
      TIDE_CALLER_BINDING("cudaMallocAsync_ptsz", Kind::rt_malloc_async), ptr, size, stream);
}

TIDE_EXPORT cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t pool,
                                                cudaStream_t stream) {
  return TIDE_BODY(Kind::rt_malloc_from_pool_async)(
      TIDE_CALLER_BINDING("cudaMallocFromPoolAsync", Kind::rt_malloc_from_pool_async), ptr, size,
      pool, stream);
}

TIDE_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void** ptr, size_t size, cudaMemPool_t pool,
                                                     cudaStream_t stream) {
  return TIDE_BODY(Kind::rt_malloc_from_pool_async)(
      TIDE_CALLER_BINDING("cudaMallocFromPoolAsync_ptsz", Kind::rt_malloc_from_pool_async), ptr,
      size, pool, stream);
}

TIDE_EXPORT cudaError_t cudaFree(void* ptr) {
  return TIDE_BODY(Kind::rt_free)(TIDE_CALLER_BINDING("cudaFree", Kind::rt_free), ptr);
}

TIDE_EXPORT cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  return TIDE_BODY(Kind::rt_free_async)(TIDE_CALLER_BINDING("cudaFreeAsync", Kind::rt_free_async),
                                        ptr, stream);
}

TIDE_EXPORT cudaError_t cudaFreeAsync_ptsz(void* ptr, cudaStream_t stream) {
  return TIDE_BODY(Kind::rt_free_async)(
      TIDE_CALLER_BINDING("cudaFreeAsync_ptsz", Kind::rt_free_async), ptr, stream);
}
