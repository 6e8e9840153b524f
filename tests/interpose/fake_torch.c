/* The two PyTorch libraries the interposer must see through, in miniature:
 * libfake_torch_global_deps.so, loaded RTLD_GLOBAL only to put the runtime in the global scope
 * (as torch/__init__.py does with libtorch_global_deps.so), and libfake_torch_cuda.so, loaded
 * RTLD_LOCAL, which calls the runtime through its PLT (as libtorch_cuda.so does). */
#include <cuda_runtime_api.h>

#define API __attribute__((visibility("default")))

#ifdef FAKE_GLOBAL_DEPS
API int fake_global_deps_device(void) {
  int device = -1;
  cudaGetDevice(&device); /* keeps the DT_NEEDED on libcudart */
  return device;
}
#else
/* The per-thread-stream variants (what code built with --default-stream per-thread calls). */
cudaError_t cudaMallocAsync_ptsz(void** ptr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync_ptsz(void* ptr, cudaStream_t stream);

API int consumer_malloc(void** ptr, size_t size) { return cudaMalloc(ptr, size); }
API int consumer_free(void* ptr) { return cudaFree(ptr); }
API int consumer_malloc_async(void** ptr, size_t size) { return cudaMallocAsync(ptr, size, 0); }
API int consumer_free_async(void* ptr) { return cudaFreeAsync(ptr, 0); }
API int consumer_malloc_async_ptsz(void** ptr, size_t size) {
  return cudaMallocAsync_ptsz(ptr, size, 0);
}
API int consumer_free_async_ptsz(void* ptr) { return cudaFreeAsync_ptsz(ptr, 0); }
API int consumer_mem_get_info(size_t* free_bytes, size_t* total) {
  return cudaMemGetInfo(free_bytes, total);
}
API int consumer_driver_entry_point(const char* symbol, unsigned int version,
                                    unsigned long long flags, void** fn) {
  enum cudaDriverEntryPointQueryResult status;
  return cudaGetDriverEntryPointByVersion(symbol, fn, version, flags, &status);
}
#endif
