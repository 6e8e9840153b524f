// The hook bodies: one per Kind, taking the Binding of the real function first, then the CUDA
// function's own arguments. The slot hooks (bindings.cpp) and the exported symbols
// (driver_exports.cpp, runtime_exports.cpp) are thin wrappers that pick the Binding.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "interpose/bindings.h"
#include "interpose/entry_points.h"

namespace tide::interpose {

// X(kind, result type, (parameter types))
#define TIDE_HOOKED_FUNCTIONS(X)                                                             \
  X(mem_alloc, CUresult, (CUdeviceptr*, size_t))                                             \
  X(mem_alloc_pitch, CUresult, (CUdeviceptr*, size_t*, size_t, size_t, unsigned int))        \
  X(mem_alloc_managed, CUresult, (CUdeviceptr*, size_t, unsigned int))                       \
  X(mem_free, CUresult, (CUdeviceptr))                                                       \
  X(mem_create, CUresult,                                                                    \
    (CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long)) \
  X(mem_release, CUresult, (CUmemGenericAllocationHandle))                                   \
  X(mem_map, CUresult,                                                                       \
    (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))         \
  X(mem_unmap, CUresult, (CUdeviceptr, size_t))                                              \
  X(mem_alloc_async, CUresult, (CUdeviceptr*, size_t, CUstream))                             \
  X(mem_free_async, CUresult, (CUdeviceptr, CUstream))                                       \
  X(mem_alloc_from_pool_async, CUresult, (CUdeviceptr*, size_t, CUmemoryPool, CUstream))     \
  X(mem_get_info, CUresult, (size_t*, size_t*))                                              \
  X(device_total_mem, CUresult, (size_t*, CUdevice))                                         \
  X(get_proc_address_v1, CUresult, (const char*, void**, int, cuuint64_t))                   \
  X(get_proc_address_v2, CUresult,                                                           \
    (const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*))                 \
  X(rt_malloc, cudaError_t, (void**, size_t))                                                \
  X(rt_malloc_pitch, cudaError_t, (void**, size_t*, size_t, size_t))                         \
  X(rt_malloc_managed, cudaError_t, (void**, size_t, unsigned int))                          \
  X(rt_malloc_async, cudaError_t, (void**, size_t, cudaStream_t))                            \
  X(rt_malloc_from_pool_async, cudaError_t, (void**, size_t, cudaMemPool_t, cudaStream_t))   \
  X(rt_free, cudaError_t, (void*))                                                           \
  X(rt_free_async, cudaError_t, (void*, cudaStream_t))

#define TIDE_UNPAREN(...) __VA_ARGS__

template <Kind K>
struct Entry;

// NOLINTBEGIN(bugprone-macro-parentheses): `params` is a parameter list
#define TIDE_DECLARE_ENTRY(kind, result, params)       \
  template <>                                          \
  struct Entry<Kind::kind> {                           \
    using Fn = result(*) params;                       \
    static result body(Binding&, TIDE_UNPAREN params); \
  };
TIDE_HOOKED_FUNCTIONS(TIDE_DECLARE_ENTRY)
#undef TIDE_DECLARE_ENTRY
// NOLINTEND(bugprone-macro-parentheses)

}  // namespace tide::interpose
