// The driver entry points the preload exports, for programs and libraries linked against
// libcuda: a PLT call lands here first (the preload precedes libcuda in the global scope).
// Only versioned names with a hooked ABI are exported; legacy names resolve to libcuda itself.
#include <cuda.h>

#include "interpose/hooks.h"
#include "interpose/plt_bindings.h"

// cuda.h maps the name cuGetProcAddress to cuGetProcAddress_v2; the preload defines both ABIs.
#undef cuGetProcAddress

#define TIDE_EXPORT extern "C" __attribute__((visibility("default")))

// The binding of the calling object's own `symbol`, for hook body `kind`.
// NOLINTBEGIN(bugprone-macro-parentheses): `kind` is a qualified name
#define TIDE_CALLER_BINDING(symbol, kind)                                \
  [](void* return_address) -> tide::interpose::Binding& {                \
    static tide::interpose::PltSite site{symbol, tide::interpose::kind}; \
    return tide::interpose::caller_binding(site, return_address);        \
  }(__builtin_return_address(0))

#define TIDE_BODY(kind) tide::interpose::Entry<tide::interpose::kind>::body
// NOLINTEND(bugprone-macro-parentheses)

TIDE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  return TIDE_BODY(Kind::mem_alloc)(TIDE_CALLER_BINDING("cuMemAlloc_v2", Kind::mem_alloc), dptr,
                                    bytes);
}

TIDE_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width,
                                        size_t height, unsigned int element) {
  return TIDE_BODY(Kind::mem_alloc_pitch)(
      TIDE_CALLER_BINDING("cuMemAllocPitch_v2", Kind::mem_alloc_pitch), dptr, pitch, width, height,
      element);
}

TIDE_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned int flags) {
  return TIDE_BODY(Kind::mem_alloc_managed)(
      TIDE_CALLER_BINDING("cuMemAllocManaged", Kind::mem_alloc_managed), dptr, bytes, flags);
}

TIDE_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return TIDE_BODY(Kind::mem_free)(TIDE_CALLER_BINDING("cuMemFree_v2", Kind::mem_free), dptr);
}

TIDE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t bytes,
                                 const CUmemAllocationProp* prop, unsigned long long flags) {
  return TIDE_BODY(Kind::mem_create)(TIDE_CALLER_BINDING("cuMemCreate", Kind::mem_create), handle,
                                     bytes, prop, flags);
}

TIDE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  return TIDE_BODY(Kind::mem_release)(TIDE_CALLER_BINDING("cuMemRelease", Kind::mem_release),
                                      handle);
}

TIDE_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                              CUmemGenericAllocationHandle handle, unsigned long long flags) {
  return TIDE_BODY(Kind::mem_map)(TIDE_CALLER_BINDING("cuMemMap", Kind::mem_map), ptr, size, offset,
                                  handle, flags);
}

TIDE_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return TIDE_BODY(Kind::mem_unmap)(TIDE_CALLER_BINDING("cuMemUnmap", Kind::mem_unmap), ptr, size);
}

TIDE_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  return TIDE_BODY(Kind::mem_alloc_async)(
      TIDE_CALLER_BINDING("cuMemAllocAsync", Kind::mem_alloc_async), dptr, bytes, stream);
}

TIDE_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  return TIDE_BODY(Kind::mem_alloc_async)(
      TIDE_CALLER_BINDING("cuMemAllocAsync_ptsz", Kind::mem_alloc_async), dptr, bytes, stream);
}

TIDE_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  return TIDE_BODY(Kind::mem_free_async)(
      TIDE_CALLER_BINDING("cuMemFreeAsync", Kind::mem_free_async), dptr, stream);
}

TIDE_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  return TIDE_BODY(Kind::mem_free_async)(
      TIDE_CALLER_BINDING("cuMemFreeAsync_ptsz", Kind::mem_free_async), dptr, stream);
}

TIDE_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                                             CUstream stream) {
  return TIDE_BODY(Kind::mem_alloc_from_pool_async)(
      TIDE_CALLER_BINDING("cuMemAllocFromPoolAsync", Kind::mem_alloc_from_pool_async), dptr, bytes,
      pool, stream);
}

TIDE_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytes,
                                                  CUmemoryPool pool, CUstream stream) {
  return TIDE_BODY(Kind::mem_alloc_from_pool_async)(
      TIDE_CALLER_BINDING("cuMemAllocFromPoolAsync_ptsz", Kind::mem_alloc_from_pool_async), dptr,
      bytes, pool, stream);
}

TIDE_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  return TIDE_BODY(Kind::mem_get_info)(TIDE_CALLER_BINDING("cuMemGetInfo_v2", Kind::mem_get_info),
                                       free, total);
}

TIDE_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice device) {
  return TIDE_BODY(Kind::device_total_mem)(
      TIDE_CALLER_BINDING("cuDeviceTotalMem_v2", Kind::device_total_mem), bytes, device);
}

TIDE_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                      cuuint64_t flags) {
  return TIDE_BODY(Kind::get_proc_address_v1)(
      TIDE_CALLER_BINDING("cuGetProcAddress", Kind::get_proc_address_v1), symbol, pfn, cuda_version,
      flags);
}

TIDE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version,
                                         cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  return TIDE_BODY(Kind::get_proc_address_v2)(
      TIDE_CALLER_BINDING("cuGetProcAddress_v2", Kind::get_proc_address_v2), symbol, pfn,
      cuda_version, flags, status);
}
