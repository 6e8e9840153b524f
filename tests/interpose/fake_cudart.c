/* A tiny stand-in CUDA runtime for the interposer's tests, finding the driver exactly as the real
 * one does (observed with libcudart.so.13 over the stand-in libcuda, FAKECUDA_TRACE=1):
 * dlopen("libcuda.so.1") with a local handle, dlsym(handle, "cuGetProcAddress_v2"), then every
 * driver function through cuGetProcAddress by base name, at the CUDA version the function got
 * its current ABI (cuMemAlloc at 3020, cuMemAllocAsync at 11020), with flags 0 and, for the
 * stream-ordered calls, also CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM.
 *
 * Built twice: as libcudart.so.13 (exported API, like the shared runtime PyTorch links) and, with
 * FAKECUDART_STATIC, into libfake_nccl.so with hidden symbols (like NCCL's static runtime).
 *
 * fakecudart_set_private_path(1) makes cudaMalloc/cudaFree call the driver through a path the
 * interposer cannot see (as a runtime using a private export table would), to exercise the
 * runtime hooks' fallback. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>

#ifdef FAKECUDART_STATIC
#define FAKECUDART_API __attribute__((visibility("hidden")))
#else
#define FAKECUDART_API __attribute__((visibility("default")))
#endif

typedef CUresult (*GetProcAddress)(const char*, void**, int, cuuint64_t,
                                   CUdriverProcAddressQueryResult*);
typedef CUresult (*MemAlloc)(CUdeviceptr*, size_t);
typedef CUresult (*MemFree)(CUdeviceptr);
typedef CUresult (*MemAllocAsync)(CUdeviceptr*, size_t, CUstream);
typedef CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
typedef CUresult (*MemGetInfo)(size_t*, size_t*);
typedef CUresult (*CtxGetDevice)(CUdevice*);
typedef void* (*FakeFunction)(const char*);

static struct {
  GetProcAddress get_proc;
  MemAlloc mem_alloc;
  MemFree mem_free;
  MemAllocAsync mem_alloc_async, mem_alloc_async_ptsz;
  MemFreeAsync mem_free_async, mem_free_async_ptsz;
  MemGetInfo mem_get_info;
  CtxGetDevice ctx_get_device;
  MemAlloc private_alloc;
  MemFree private_free;
  cudaError_t error;
} driver;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int private_path = 0;

static void* query(const char* symbol, int version, cuuint64_t flags) {
  void* fn = NULL;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (driver.get_proc(symbol, &fn, version, flags, &status) != CUDA_SUCCESS ||
      status != CU_GET_PROC_ADDRESS_SUCCESS) {
    driver.error = cudaErrorInsufficientDriver;
  }
  return fn;
}

static void load(void) {
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == NULL) {
    driver.error = cudaErrorInsufficientDriver;
    return;
  }
  driver.get_proc = (GetProcAddress)dlsym(handle, "cuGetProcAddress_v2");
  if (driver.get_proc == NULL) {
    driver.error = cudaErrorInsufficientDriver;
    return;
  }
  const cuuint64_t per_thread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  driver.mem_alloc = (MemAlloc)query("cuMemAlloc", 3020, 0);
  driver.mem_free = (MemFree)query("cuMemFree", 3020, 0);
  driver.mem_get_info = (MemGetInfo)query("cuMemGetInfo", 3020, 0);
  driver.ctx_get_device = (CtxGetDevice)query("cuCtxGetDevice", 2000, 0);
  driver.mem_alloc_async = (MemAllocAsync)query("cuMemAllocAsync", 11020, 0);
  driver.mem_alloc_async_ptsz = (MemAllocAsync)query("cuMemAllocAsync", 11020, per_thread);
  driver.mem_free_async = (MemFreeAsync)query("cuMemFreeAsync", 11020, 0);
  driver.mem_free_async_ptsz = (MemFreeAsync)query("cuMemFreeAsync", 11020, per_thread);
  FakeFunction private_table = (FakeFunction)dlsym(handle, "fakecuda_function");
  if (private_table != NULL) {
    driver.private_alloc = (MemAlloc)private_table("cuMemAlloc_v2");
    driver.private_free = (MemFree)private_table("cuMemFree_v2");
  }
}

static cudaError_t init(void) {
  pthread_once(&once, load);
  return driver.error;
}

static cudaError_t to_runtime(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS:
      return cudaSuccess;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return cudaErrorMemoryAllocation;
    case CUDA_ERROR_INVALID_VALUE:
      return cudaErrorInvalidValue;
    default:
      return cudaErrorUnknown;
  }
}

FAKECUDART_API void fakecudart_set_private_path(int on) { private_path = on; }

FAKECUDART_API cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (init() != cudaSuccess) return driver.error;
  if (ptr == NULL) return cudaErrorInvalidValue;
  MemAlloc alloc = private_path ? driver.private_alloc : driver.mem_alloc;
  return to_runtime(alloc((CUdeviceptr*)ptr, size));
}

FAKECUDART_API cudaError_t cudaFree(void* ptr) {
  if (init() != cudaSuccess) return driver.error;
  if (ptr == NULL) return cudaSuccess;
  MemFree release = private_path ? driver.private_free : driver.mem_free;
  return to_runtime(release((CUdeviceptr)ptr));
}

FAKECUDART_API cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  if (init() != cudaSuccess) return driver.error;
  if (ptr == NULL) return cudaErrorInvalidValue;
  return to_runtime(driver.mem_alloc_async((CUdeviceptr*)ptr, size, (CUstream)stream));
}

FAKECUDART_API cudaError_t cudaMallocAsync_ptsz(void** ptr, size_t size, cudaStream_t stream) {
  if (init() != cudaSuccess) return driver.error;
  if (ptr == NULL) return cudaErrorInvalidValue;
  return to_runtime(driver.mem_alloc_async_ptsz((CUdeviceptr*)ptr, size, (CUstream)stream));
}

FAKECUDART_API cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  if (init() != cudaSuccess) return driver.error;
  return to_runtime(driver.mem_free_async((CUdeviceptr)ptr, (CUstream)stream));
}

FAKECUDART_API cudaError_t cudaFreeAsync_ptsz(void* ptr, cudaStream_t stream) {
  if (init() != cudaSuccess) return driver.error;
  return to_runtime(driver.mem_free_async_ptsz((CUdeviceptr)ptr, (CUstream)stream));
}

FAKECUDART_API cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  if (init() != cudaSuccess) return driver.error;
  return to_runtime(driver.mem_get_info(free_bytes, total));
}

FAKECUDART_API cudaError_t cudaGetDevice(int* device) {
  if (init() != cudaSuccess) return driver.error;
  if (device == NULL) return cudaErrorInvalidValue;
  CUdevice d = 0;
  const cudaError_t r = to_runtime(driver.ctx_get_device(&d));
  *device = d;
  return r;
}

/* What PyTorch uses for the virtual-memory calls: the driver's cuGetProcAddress, relayed. */
FAKECUDART_API cudaError_t cudaGetDriverEntryPointByVersion(
    const char* symbol, void** fn, unsigned int cuda_version, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult* status) {
  if (init() != cudaSuccess) return driver.error;
  CUdriverProcAddressQueryResult driver_status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult r = driver.get_proc(symbol, fn, (int)cuda_version, flags, &driver_status);
  if (status != NULL) *status = (enum cudaDriverEntryPointQueryResult)driver_status;
  return r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_FOUND ? cudaSuccess : to_runtime(r);
}
