// The CUDA driver API as a table of function pointers, loaded at run time.
//
// libtide.so never links libcuda: the driver is dlopen()ed on first use ("libcuda.so.1", or the
// library named by TIDE_CUDA_DRIVER, e.g. the host stand-in driver). Functions are resolved
// through cuGetProcAddress_v2 with the CUDA 12.0 ABI where the driver has it, else by their
// versioned symbol names with dlsym.
#pragma once

#include <cuda.h>

#include <string>

namespace tide::driver {

// X(name, symbol_for_dlsym, required). `name` is the cuda.h name (which cuda.h may #define to a
// versioned symbol: the member's type follows). Optional functions may be null.
#define TIDE_CUDA_FUNCTIONS(X)                                             \
  X(cuInit, "cuInit", true)                                                \
  X(cuDriverGetVersion, "cuDriverGetVersion", true)                        \
  X(cuGetErrorName, "cuGetErrorName", true)                                \
  X(cuGetErrorString, "cuGetErrorString", true)                            \
  X(cuDeviceGet, "cuDeviceGet", true)                                      \
  X(cuDeviceGetCount, "cuDeviceGetCount", true)                            \
  X(cuDeviceGetName, "cuDeviceGetName", true)                              \
  X(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId", false)                     \
  X(cuDeviceTotalMem, "cuDeviceTotalMem_v2", true)                         \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute", true)                    \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", true)            \
  X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", true)       \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", true)                              \
  X(cuCtxGetCurrent, "cuCtxGetCurrent", true)                              \
  X(cuCtxPushCurrent, "cuCtxPushCurrent_v2", true)                         \
  X(cuCtxPopCurrent, "cuCtxPopCurrent_v2", true)                           \
  X(cuCtxSynchronize, "cuCtxSynchronize", true)                            \
  X(cuMemGetInfo, "cuMemGetInfo_v2", true)                                 \
  X(cuMemAlloc, "cuMemAlloc_v2", true)                                     \
  X(cuMemFree, "cuMemFree_v2", true)                                       \
  X(cuMemcpyHtoD, "cuMemcpyHtoD_v2", true)                                 \
  X(cuMemcpyDtoH, "cuMemcpyDtoH_v2", true)                                 \
  X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", true)                       \
  X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", true)                       \
  X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", true)                       \
  X(cuMemsetD8Async, "cuMemsetD8Async", true)                              \
  X(cuMemHostRegister, "cuMemHostRegister_v2", true)                       \
  X(cuMemHostUnregister, "cuMemHostUnregister", true)                      \
  X(cuMemHostAlloc, "cuMemHostAlloc", true)                                \
  X(cuMemFreeHost, "cuMemFreeHost", true)                                  \
  X(cuStreamCreate, "cuStreamCreate", true)                                \
  X(cuStreamDestroy, "cuStreamDestroy_v2", true)                           \
  X(cuStreamSynchronize, "cuStreamSynchronize", true)                      \
  X(cuStreamQuery, "cuStreamQuery", true)                                  \
  X(cuStreamWaitEvent, "cuStreamWaitEvent", true)                          \
  X(cuLaunchHostFunc, "cuLaunchHostFunc", true)                            \
  X(cuEventCreate, "cuEventCreate", true)                                  \
  X(cuEventRecord, "cuEventRecord", true)                                  \
  X(cuEventQuery, "cuEventQuery", true)                                    \
  X(cuEventSynchronize, "cuEventSynchronize", true)                        \
  X(cuEventDestroy, "cuEventDestroy_v2", true)                             \
  X(cuEventElapsedTime, "cuEventElapsedTime", true)                        \
  X(cuModuleLoadData, "cuModuleLoadData", true)                            \
  X(cuModuleUnload, "cuModuleUnload", true)                                \
  X(cuModuleGetFunction, "cuModuleGetFunction", true)                      \
  X(cuLaunchKernel, "cuLaunchKernel", true)                                \
  X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", false) \
  X(cuMemAddressReserve, "cuMemAddressReserve", false)                     \
  X(cuMemAddressFree, "cuMemAddressFree", false)                           \
  X(cuMemCreate, "cuMemCreate", false)                                     \
  X(cuMemRelease, "cuMemRelease", false)                                   \
  X(cuMemMap, "cuMemMap", false)                                           \
  X(cuMemUnmap, "cuMemUnmap", false)                                       \
  X(cuMemSetAccess, "cuMemSetAccess", false)                               \
  X(cuPointerGetAttribute, "cuPointerGetAttribute", false)

struct CudaApi {
// NOLINTNEXTLINE(bugprone-macro-parentheses): `name` is a declarator, not an expression
#define TIDE_CUDA_MEMBER(name, symbol, required) decltype(&::name) name = nullptr;
  TIDE_CUDA_FUNCTIONS(TIDE_CUDA_MEMBER)
#undef TIDE_CUDA_MEMBER

  std::string library;  // what was loaded, as given to dlopen
  int version = 0;      // cuDriverGetVersion, e.g. 13000

  // Whether the virtual-memory calls (cuMemCreate, cuMemMap, ...) are all present.
  bool has_vmm() const;
};

// Loads and initialises (cuInit) the driver at `library`. Throws DriverNotFound if it cannot be
// loaded or lacks a required function, CudaError if cuInit fails. The library stays loaded.
CudaApi load_driver(const std::string& library);

// The process's driver, loaded once on first use from TIDE_CUDA_DRIVER or "libcuda.so.1".
// A failed load throws and is retried by the next call.
const CudaApi& cuda();

}  // namespace tide::driver
