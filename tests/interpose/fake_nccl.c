/* A library carrying its own, statically linked CUDA runtime (fake_cudart.c built with hidden
 * symbols), as NCCL does: its allocations reach the driver only through the cuGetProcAddress its
 * private runtime found with its own dlopen of libcuda.so.1. */
#include <cuda_runtime_api.h>

#define API __attribute__((visibility("default")))

API int fake_nccl_alloc(void** ptr, size_t size) { return cudaMalloc(ptr, size); }
API int fake_nccl_free(void* ptr) { return cudaFree(ptr); }
