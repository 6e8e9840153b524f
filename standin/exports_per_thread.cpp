// The per-thread default stream variants (_ptds for synchronous calls, _ptsz for those taking a
// stream): a null stream means the calling thread's per-thread default stream. cuGetProcAddress
// returns them for CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, as a real driver does.
#include "standin/exports.h"

#include "standin/copies.h"
#include "standin/device_memory.h"
#include "standin/events.h"
#include "standin/modules.h"
#include "standin/streams.h"

namespace s = tide::standin;
using s::call;
using s::call_in_context;

namespace {
constexpr auto kPerThread = s::DefaultStream::kPerThread;
}  // namespace

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice,
                                                          const void* srcHost, size_t ByteCount) {
  return call_in_context(
      [&] { return s::copy_to_device(dstDevice, srcHost, ByteCount, kPerThread); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void* dstHost, CUdeviceptr srcDevice,
                                                          size_t ByteCount) {
  return call_in_context(
      [&] { return s::copy_to_host(dstHost, srcDevice, ByteCount, kPerThread); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice,
                                                               const void* srcHost,
                                                               size_t ByteCount, CUstream hStream) {
  return call_in_context(
      [&] { return s::copy_to_device_async(dstDevice, srcHost, ByteCount, hStream, kPerThread); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void* dstHost, CUdeviceptr srcDevice,
                                                               size_t ByteCount, CUstream hStream) {
  return call_in_context(
      [&] { return s::copy_to_host_async(dstHost, srcDevice, ByteCount, hStream, kPerThread); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice,
                                                               CUdeviceptr srcDevice,
                                                               size_t ByteCount, CUstream hStream) {
  return call_in_context([&] {
    return s::copy_on_device_async(dstDevice, srcDevice, ByteCount, hStream, kPerThread);
  });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc,
                                                          size_t N, CUstream hStream) {
  return call_in_context([&] { return s::memset_d8_async(dstDevice, uc, N, hStream, kPerThread); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                          CUstream hStream) {
  return call_in_context([&] { return s::mem_alloc_async(dptr, bytesize, hStream, kPerThread); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  return call_in_context([&] { return s::mem_free_async(dptr, hStream, kPerThread); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream) {
  return call_in_context([&] { return s::stream_synchronize(hStream, kPerThread); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuStreamQuery_ptsz(CUstream hStream) {
  return call_in_context([&] { return s::stream_query(hStream, kPerThread); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent,
                                                            unsigned int Flags) {
  return call_in_context([&] { return s::stream_wait_event(hStream, hEvent, Flags, kPerThread); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn,
                                                           void* userData) {
  return call_in_context([&] { return s::launch_host_func(hStream, fn, userData, kPerThread); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
  return call_in_context([&] { return s::event_record(hEvent, hStream, kPerThread); });
}

TIDE_STANDIN_EXPORT CUresult CUDAAPI cuLaunchKernel_ptsz(
    CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
    unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
    unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra) {
  return call_in_context([&] {
    const unsigned grid[3] = {gridDimX, gridDimY, gridDimZ};
    const unsigned block[3] = {blockDimX, blockDimY, blockDimZ};
    return s::launch_kernel(f, grid, block, sharedMemBytes, hStream, kernelParams, extra,
                            kPerThread);
  });
}
