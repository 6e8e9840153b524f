// The exported driver functions, CUDA 12/13 ABI: what cuda.h's names resolve to.
#include "standin/exports.h"

#include "standin/contexts.h"
#include "standin/copies.h"
#include "standin/device_memory.h"
#include "standin/devices.h"
#include "standin/errors.h"
#include "standin/events.h"
#include "standin/host_memory.h"
#include "standin/init.h"
#include "standin/modules.h"
#include "standin/pointers.h"
#include "standin/streams.h"
#include "standin/virtual_memory.h"

namespace s = tide::standin;
using s::call;
using s::call_in_context;
using s::call_uninitialized;
using s::guarded;

namespace {
constexpr auto kLegacy = s::DefaultStream::kLegacy;
}  // namespace

// Initialisation and errors.

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuInit(unsigned int Flags) {
  return call_uninitialized([&] {
    const CUresult r = s::initialize(Flags);
    // TIDE_STANDIN_DEVICE_LOST=1 loses the device from this very call on.
    return r == CUDA_SUCCESS && s::device_lost() ? CUDA_ERROR_DEVICE_UNAVAILABLE : r;
  });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuDriverGetVersion(int* driverVersion) {
  return call_uninitialized([&] {
    if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = 13000;
    return CUDA_SUCCESS;
  });
}

// Not counted: a caller must be able to name the error of a lost device.
TIDE_STANDIN_EXPORT CUresult CUDAAPI cuGetErrorName(CUresult error, const char** pStr) {
  return guarded([&] { return s::error_name(error, pStr); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuGetErrorString(CUresult error, const char** pStr) {
  return guarded([&] { return s::error_string(error, pStr); });
}

// Devices and contexts.

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  return call([&] { return s::device_get(device, ordinal); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuDeviceGetCount(int* count) {
  return call([&] { return s::device_get_count(count); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  return call([&] { return s::device_get_name(name, len, dev); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  return call([&] { return s::device_get_pci_bus_id(pciBusId, len, dev); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  return call([&] { return s::device_total_mem(bytes, dev); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib,
                                                          CUdevice dev) {
  return call([&] { return s::device_get_attribute(pi, attrib, dev); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  return call([&] { return s::primary_ctx_retain(pctx, dev); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return call([&] { return s::primary_ctx_release(dev); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  return call([&] { return s::ctx_set_current(ctx); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
  return call([&] { return s::ctx_get_current(pctx); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  return call([&] { return s::ctx_push_current(ctx); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  return call([&] { return s::ctx_pop_current(pctx); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuCtxSynchronize(void) {
  return call([&] { return s::ctx_synchronize(nullptr); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  return call([&] { return s::ctx_synchronize(ctx); });
}

// Device memory.

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  return call_in_context([&] { return s::mem_get_info(free, total); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return call_in_context([&] { return s::mem_alloc(dptr, bytesize); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  return call_in_context([&] { return s::mem_free(dptr); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize,
                                                     CUstream hStream) {
  return call_in_context([&] { return s::mem_alloc_async(dptr, bytesize, hStream, kLegacy); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  return call_in_context([&] { return s::mem_free_async(dptr, hStream, kLegacy); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuPointerGetAttribute(void* data,
                                                           CUpointer_attribute attribute,
                                                           CUdeviceptr ptr) {
  return call([&] { return s::pointer_get_attribute(data, attribute, ptr); });
}

// Copies.

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost,
                                                     size_t ByteCount) {
  return call_in_context([&] { return s::copy_to_device(dstDevice, srcHost, ByteCount, kLegacy); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice,
                                                     size_t ByteCount) {
  return call_in_context([&] { return s::copy_to_host(dstHost, srcDevice, ByteCount, kLegacy); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice,
                                                          const void* srcHost, size_t ByteCount,
                                                          CUstream hStream) {
  return call_in_context(
      [&] { return s::copy_to_device_async(dstDevice, srcHost, ByteCount, hStream, kLegacy); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice,
                                                          size_t ByteCount, CUstream hStream) {
  return call_in_context(
      [&] { return s::copy_to_host_async(dstHost, srcDevice, ByteCount, hStream, kLegacy); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice,
                                                          CUdeviceptr srcDevice, size_t ByteCount,
                                                          CUstream hStream) {
  return call_in_context(
      [&] { return s::copy_on_device_async(dstDevice, srcDevice, ByteCount, hStream, kLegacy); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc,
                                                     size_t N, CUstream hStream) {
  return call_in_context([&] { return s::memset_d8_async(dstDevice, uc, N, hStream, kLegacy); });
}

// Page-locked host memory.

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemHostRegister_v2(void* p, size_t bytesize,
                                                          unsigned int Flags) {
  return call_in_context([&] { return s::host_register(p, bytesize, Flags); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemHostUnregister(void* p) {
  return call_in_context([&] { return s::host_unregister(p); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize,
                                                    unsigned int Flags) {
  return call_in_context([&] { return s::host_alloc(pp, bytesize, Flags); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemFreeHost(void* p) {
  return call_in_context([&] { return s::free_host(p); });
}

// Streams and events.

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  return call_in_context([&] { return s::stream_create(phStream, Flags); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
  return call_in_context([&] { return s::stream_destroy(hStream); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
  return call_in_context([&] { return s::stream_synchronize(hStream, kLegacy); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuStreamQuery(CUstream hStream) {
  return call_in_context([&] { return s::stream_query(hStream, kLegacy); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent,
                                                       unsigned int Flags) {
  return call_in_context([&] { return s::stream_wait_event(hStream, hEvent, Flags, kLegacy); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn,
                                                      void* userData) {
  return call_in_context([&] { return s::launch_host_func(hStream, fn, userData, kLegacy); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  return call_in_context([&] { return s::event_create(phEvent, Flags); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
  return call_in_context([&] { return s::event_record(hEvent, hStream, kLegacy); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
  return call_in_context([&] { return s::event_query(hEvent); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  return call_in_context([&] { return s::event_synchronize(hEvent); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent) {
  return call_in_context([&] { return s::event_destroy(hEvent); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart,
                                                           CUevent hEnd) {
  return call_in_context([&] { return s::event_elapsed_time(pMilliseconds, hStart, hEnd); });
}

// Modules and launches.

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) {
  return call_in_context([&] { return s::module_load_data(module, image); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuModuleUnload(CUmodule hmod) {
  return call_in_context([&] { return s::module_unload(hmod); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod,
                                                         const char* name) {
  return call_in_context([&] { return s::module_get_function(hfunc, hmod, name); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX,
                                                    unsigned int gridDimY, unsigned int gridDimZ,
                                                    unsigned int blockDimX, unsigned int blockDimY,
                                                    unsigned int blockDimZ,
                                                    unsigned int sharedMemBytes, CUstream hStream,
                                                    void** kernelParams, void** extra) {
  return call_in_context([&] {
    const unsigned grid[3] = {gridDimX, gridDimY, gridDimZ};
    const unsigned block[3] = {blockDimX, blockDimY, blockDimZ};
    return s::launch_kernel(f, grid, block, sharedMemBytes, hStream, kernelParams, extra, kLegacy);
  });
}

// Virtual memory management.

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemGetAllocationGranularity(
    size_t* granularity, const CUmemAllocationProp* prop, CUmemAllocationGranularity_flags option) {
  return call([&] { return s::mem_get_allocation_granularity(granularity, prop, option); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size,
                                                         size_t alignment, CUdeviceptr addr,
                                                         unsigned long long flags) {
  return call_in_context([&] { return s::mem_address_reserve(ptr, size, alignment, addr, flags); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return call_in_context([&] { return s::mem_address_free(ptr, size); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                                 const CUmemAllocationProp* prop,
                                                 unsigned long long flags) {
  return call_in_context([&] { return s::mem_create(handle, size, prop, flags); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  return call_in_context([&] { return s::mem_release(handle); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                              CUmemGenericAllocationHandle handle,
                                              unsigned long long flags) {
  return call_in_context([&] { return s::mem_map(ptr, size, offset, handle, flags); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return call_in_context([&] { return s::mem_unmap(ptr, size); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size,
                                                    const CUmemAccessDesc* desc, size_t count) {
  return call_in_context([&] { return s::mem_set_access(ptr, size, desc, count); });
}
