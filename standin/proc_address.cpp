// cuGetProcAddress: a driver function by its base name, for the CUDA version the caller was
// built for. Each base name has the versions a real driver has (cudaTypedefs.h names them, e.g.
// PFN_cuMemAlloc_v3020); the newest one not newer than the requested version wins, and with
// CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM its _ptds/_ptsz variant where there is one.
#include "standin/exports.h"

#include <algorithm>
#include <cstring>

namespace {

struct Entry {
  const char* name;
  int version;  // the CUDA version that introduced this variant
  void* function;
  void* per_thread;  // the _ptds/_ptsz variant, if any
};

template <typename F>
void* fn(F* f) {
  return reinterpret_cast<void*>(f);
}

const Entry kEntries[] = {
    {"cuInit", 2000, fn(&cuInit), nullptr},
    {"cuDriverGetVersion", 2020, fn(&cuDriverGetVersion), nullptr},
    {"cuGetErrorName", 6000, fn(&cuGetErrorName), nullptr},
    {"cuGetErrorString", 6000, fn(&cuGetErrorString), nullptr},
    {"cuGetProcAddress", 11030, fn(&cuGetProcAddress), nullptr},
    {"cuGetProcAddress", 12000, fn(&cuGetProcAddress_v2), nullptr},
    {"cuDeviceGet", 2000, fn(&cuDeviceGet), nullptr},
    {"cuDeviceGetCount", 2000, fn(&cuDeviceGetCount), nullptr},
    {"cuDeviceGetName", 2000, fn(&cuDeviceGetName), nullptr},
    {"cuDeviceGetPCIBusId", 4010, fn(&cuDeviceGetPCIBusId), nullptr},
    {"cuDeviceTotalMem", 2000, fn(&cuDeviceTotalMem), nullptr},
    {"cuDeviceTotalMem", 3020, fn(&cuDeviceTotalMem_v2), nullptr},
    {"cuDeviceGetAttribute", 2000, fn(&cuDeviceGetAttribute), nullptr},
    {"cuDevicePrimaryCtxRetain", 7000, fn(&cuDevicePrimaryCtxRetain), nullptr},
    {"cuDevicePrimaryCtxRelease", 7000, fn(&cuDevicePrimaryCtxRelease), nullptr},
    {"cuDevicePrimaryCtxRelease", 11000, fn(&cuDevicePrimaryCtxRelease_v2), nullptr},
    {"cuCtxSetCurrent", 4000, fn(&cuCtxSetCurrent), nullptr},
    {"cuCtxGetCurrent", 4000, fn(&cuCtxGetCurrent), nullptr},
    {"cuCtxPushCurrent", 4000, fn(&cuCtxPushCurrent_v2), nullptr},
    {"cuCtxPopCurrent", 4000, fn(&cuCtxPopCurrent_v2), nullptr},
    {"cuCtxSynchronize", 2000, fn(&cuCtxSynchronize), nullptr},
    {"cuCtxSynchronize", 13000, fn(&cuCtxSynchronize_v2), nullptr},
    {"cuMemGetInfo", 2000, fn(&cuMemGetInfo), nullptr},
    {"cuMemGetInfo", 3020, fn(&cuMemGetInfo_v2), nullptr},
    {"cuMemAlloc", 2000, fn(&cuMemAlloc), nullptr},
    {"cuMemAlloc", 3020, fn(&cuMemAlloc_v2), nullptr},
    {"cuMemFree", 2000, fn(&cuMemFree), nullptr},
    {"cuMemFree", 3020, fn(&cuMemFree_v2), nullptr},
    {"cuMemAllocAsync", 11020, fn(&cuMemAllocAsync), fn(&cuMemAllocAsync_ptsz)},
    {"cuMemFreeAsync", 11020, fn(&cuMemFreeAsync), fn(&cuMemFreeAsync_ptsz)},
    {"cuPointerGetAttribute", 4000, fn(&cuPointerGetAttribute), nullptr},
    {"cuMemcpyHtoD", 2000, fn(&cuMemcpyHtoD), nullptr},
    {"cuMemcpyHtoD", 3020, fn(&cuMemcpyHtoD_v2), fn(&cuMemcpyHtoD_v2_ptds)},
    {"cuMemcpyDtoH", 2000, fn(&cuMemcpyDtoH), nullptr},
    {"cuMemcpyDtoH", 3020, fn(&cuMemcpyDtoH_v2), fn(&cuMemcpyDtoH_v2_ptds)},
    {"cuMemcpyHtoDAsync", 2000, fn(&cuMemcpyHtoDAsync), nullptr},
    {"cuMemcpyHtoDAsync", 3020, fn(&cuMemcpyHtoDAsync_v2), fn(&cuMemcpyHtoDAsync_v2_ptsz)},
    {"cuMemcpyDtoHAsync", 2000, fn(&cuMemcpyDtoHAsync), nullptr},
    {"cuMemcpyDtoHAsync", 3020, fn(&cuMemcpyDtoHAsync_v2), fn(&cuMemcpyDtoHAsync_v2_ptsz)},
    {"cuMemcpyDtoDAsync", 3000, fn(&cuMemcpyDtoDAsync), nullptr},
    {"cuMemcpyDtoDAsync", 3020, fn(&cuMemcpyDtoDAsync_v2), fn(&cuMemcpyDtoDAsync_v2_ptsz)},
    {"cuMemsetD8Async", 3020, fn(&cuMemsetD8Async), fn(&cuMemsetD8Async_ptsz)},
    {"cuMemHostRegister", 4000, fn(&cuMemHostRegister), nullptr},
    {"cuMemHostRegister", 6050, fn(&cuMemHostRegister_v2), nullptr},
    {"cuMemHostUnregister", 4000, fn(&cuMemHostUnregister), nullptr},
    {"cuMemHostAlloc", 2020, fn(&cuMemHostAlloc), nullptr},
    {"cuMemFreeHost", 2000, fn(&cuMemFreeHost), nullptr},
    {"cuStreamCreate", 2000, fn(&cuStreamCreate), nullptr},
    {"cuStreamDestroy", 2000, fn(&cuStreamDestroy), nullptr},
    {"cuStreamDestroy", 4000, fn(&cuStreamDestroy_v2), nullptr},
    {"cuStreamSynchronize", 2000, fn(&cuStreamSynchronize), fn(&cuStreamSynchronize_ptsz)},
    {"cuStreamQuery", 2000, fn(&cuStreamQuery), fn(&cuStreamQuery_ptsz)},
    {"cuStreamWaitEvent", 3020, fn(&cuStreamWaitEvent), fn(&cuStreamWaitEvent_ptsz)},
    {"cuLaunchHostFunc", 10000, fn(&cuLaunchHostFunc), fn(&cuLaunchHostFunc_ptsz)},
    {"cuEventCreate", 2000, fn(&cuEventCreate), nullptr},
    {"cuEventRecord", 2000, fn(&cuEventRecord), fn(&cuEventRecord_ptsz)},
    {"cuEventQuery", 2000, fn(&cuEventQuery), nullptr},
    {"cuEventSynchronize", 2000, fn(&cuEventSynchronize), nullptr},
    {"cuEventDestroy", 2000, fn(&cuEventDestroy), nullptr},
    {"cuEventDestroy", 4000, fn(&cuEventDestroy_v2), nullptr},
    {"cuEventElapsedTime", 2000, fn(&cuEventElapsedTime), nullptr},
    {"cuEventElapsedTime", 12080, fn(&cuEventElapsedTime_v2), nullptr},
    {"cuModuleLoadData", 2000, fn(&cuModuleLoadData), nullptr},
    {"cuModuleUnload", 2000, fn(&cuModuleUnload), nullptr},
    {"cuModuleGetFunction", 2000, fn(&cuModuleGetFunction), nullptr},
    {"cuLaunchKernel", 4000, fn(&cuLaunchKernel), fn(&cuLaunchKernel_ptsz)},
    {"cuMemGetAllocationGranularity", 10020, fn(&cuMemGetAllocationGranularity), nullptr},
    {"cuMemAddressReserve", 10020, fn(&cuMemAddressReserve), nullptr},
    {"cuMemAddressFree", 10020, fn(&cuMemAddressFree), nullptr},
    {"cuMemCreate", 10020, fn(&cuMemCreate), nullptr},
    {"cuMemRelease", 10020, fn(&cuMemRelease), nullptr},
    {"cuMemMap", 10020, fn(&cuMemMap), nullptr},
    {"cuMemUnmap", 10020, fn(&cuMemUnmap), nullptr},
    {"cuMemSetAccess", 10020, fn(&cuMemSetAccess), nullptr},
};

// The per-thread default stream arrived in CUDA 7.0.
constexpr int kPerThreadVersion = 7000;

CUresult lookup(const char* symbol, void** pfn, int version, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  constexpr cuuint64_t kKnown =
      CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (pfn != nullptr) *pfn = nullptr;
  if (symbol == nullptr || pfn == nullptr || (flags & ~kKnown) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const Entry* best = nullptr;
  bool known = false;
  for (const Entry& e : kEntries) {
    if (std::strcmp(e.name, symbol) != 0) continue;
    known = true;
    if (e.version <= version && (best == nullptr || e.version > best->version)) best = &e;
  }
  if (best == nullptr) {
    if (known && status != nullptr) *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    return CUDA_ERROR_NOT_FOUND;
  }
  // Flags 0 (CU_GET_PROC_ADDRESS_DEFAULT) mean the legacy stream, as for a caller built
  // without --default-stream per-thread.
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0 &&
                          (flags & CU_GET_PROC_ADDRESS_LEGACY_STREAM) == 0;
  *pfn = per_thread && best->per_thread != nullptr &&
                 version >= std::max(kPerThreadVersion, best->version)
             ? best->per_thread
             : best->function;
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

}  // namespace

// Not counted and usable before cuInit: it is how callers find cuInit.
TIDE_STANDIN_EXPORT CUresult CUDAAPI
cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                    CUdriverProcAddressQueryResult* symbolStatus) {
  return tide::standin::guarded(
      [&] { return lookup(symbol, pfn, cudaVersion, flags, symbolStatus); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn,
                                                      int cudaVersion, cuuint64_t flags) {
  return tide::standin::guarded([&] { return lookup(symbol, pfn, cudaVersion, flags, nullptr); });
}
