// The legacy entry points a real libcuda still exports under the base names that cuda.h now
// #defines to newer versions: the CUDA 2.x/3.0 ones with 32-bit device pointers and sizes, and the
// older versions of calls whose signature did not change. dlsym("cuMemAlloc") or
// cuGetProcAddress("cuMemAlloc", 3000) finds these, as with a real driver.
//
// 32-bit device pointers come from the low 2 GiB (MAP_32BIT); sizes that do not fit in 32 bits
// are reported as 0xffffffff (saturated) rather than truncated.
#include "standin/exports.h"

#include <cstdint>
#include <limits>

#include "standin/contexts.h"
#include "standin/copies.h"
#include "standin/device_memory.h"
#include "standin/devices.h"
#include "standin/events.h"
#include "standin/host_memory.h"
#include "standin/streams.h"

namespace s = tide::standin;
using s::call;
using s::call_in_context;

namespace {

constexpr auto kLegacy = s::DefaultStream::kLegacy;

unsigned int saturate(std::size_t value) {
  constexpr std::size_t kMax = std::numeric_limits<unsigned int>::max();
  return static_cast<unsigned int>(value < kMax ? value : kMax);
}

}  // namespace

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuDeviceTotalMem(unsigned int* bytes, CUdevice dev) {
  return call([&] {
    if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::size_t total = 0;
    const CUresult r = s::device_total_mem(&total, dev);
    if (r == CUDA_SUCCESS) *bytes = saturate(total);
    return r;
  });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemGetInfo(unsigned int* free, unsigned int* total) {
  return call_in_context([&] {
    if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::size_t f = 0;
    std::size_t t = 0;
    const CUresult r = s::mem_get_info(&f, &t);
    if (r == CUDA_SUCCESS) {
      *free = saturate(f);
      *total = saturate(t);
    }
    return r;
  });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int bytesize) {
  return call_in_context([&] {
    if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr p = 0;
    const CUresult r = s::mem_alloc(&p, bytesize, /*low=*/true);
    if (r == CUDA_SUCCESS) *dptr = static_cast<CUdeviceptr_v1>(p);
    return r;
  });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemFree(CUdeviceptr_v1 dptr) {
  return call_in_context([&] { return s::mem_free(dptr); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr_v1 dstDevice, const void* srcHost,
                                                  unsigned int ByteCount) {
  return call_in_context([&] { return s::copy_to_device(dstDevice, srcHost, ByteCount, kLegacy); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemcpyDtoH(void* dstHost, CUdeviceptr_v1 srcDevice,
                                                  unsigned int ByteCount) {
  return call_in_context([&] { return s::copy_to_host(dstHost, srcDevice, ByteCount, kLegacy); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr_v1 dstDevice,
                                                       const void* srcHost, unsigned int ByteCount,
                                                       CUstream hStream) {
  return call_in_context(
      [&] { return s::copy_to_device_async(dstDevice, srcHost, ByteCount, hStream, kLegacy); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemcpyDtoHAsync(void* dstHost, CUdeviceptr_v1 srcDevice,
                                                       unsigned int ByteCount, CUstream hStream) {
  return call_in_context(
      [&] { return s::copy_to_host_async(dstHost, srcDevice, ByteCount, hStream, kLegacy); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr_v1 dstDevice,
                                                       CUdeviceptr_v1 srcDevice,
                                                       unsigned int ByteCount, CUstream hStream) {
  return call_in_context(
      [&] { return s::copy_on_device_async(dstDevice, srcDevice, ByteCount, hStream, kLegacy); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemHostRegister(void* p, size_t bytesize,
                                                       unsigned int Flags) {
  return call_in_context([&] { return s::host_register(p, bytesize, Flags); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
  return call([&] { return s::primary_ctx_release(dev); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuStreamDestroy(CUstream hStream) {
  return call_in_context([&] { return s::stream_destroy(hStream); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuEventDestroy(CUevent hEvent) {
  return call_in_context([&] { return s::event_destroy(hEvent); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuEventElapsedTime(float* pMilliseconds, CUevent hStart,
                                                        CUevent hEnd) {
  return call_in_context([&] { return s::event_elapsed_time(pMilliseconds, hStart, hEnd); });
}
