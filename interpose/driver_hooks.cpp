// The driver hooks: device memory allocation and release, and what the limit changes.
//
// Every hook returns the driver's own CUresult, except CUDA_ERROR_OUT_OF_MEMORY when the memory
// limit refuses an allocation (the driver is then not called) and CUDA_ERROR_NOT_INITIALIZED
// when the function exists nowhere the caller could have reached. Calls the driver itself would
// reject (null output pointers, zero sizes) go to it unrecorded, so it answers them.
#include <cuda.h>

#include <cstdint>

#include "interpose/hooks.h"
#include "interpose/interposer.h"
#include "interpose/thread_state.h"

namespace tide::interpose {
namespace {

constexpr CUresult kNoFunction = CUDA_ERROR_NOT_INITIALIZED;

// What the allocation is charged to: the runtime call above it, or the driver entry point.
Kind origin(Kind driver_kind) {
  const Kind runtime = thread_state().runtime_call;
  return runtime != Kind::count ? runtime : driver_kind;
}

// CUdeviceptr and CUmemGenericAllocationHandle: both keys of LiveAllocations.
static_assert(sizeof(CUdeviceptr) == sizeof(std::uint64_t));
static_assert(sizeof(CUmemGenericAllocationHandle) == sizeof(std::uint64_t));

// Reserves `bytes` under the limit, makes the driver call, records the result at `*key`.
template <typename Call>
CUresult allocate(Binding& binding, Kind kind, LiveAllocations& (Interposer::*table)(),
                  const unsigned long long* key, std::uint64_t bytes, int device, CUstream stream,
                  Call&& call) {
  Interposer& ip = Interposer::get();
  const DriverHookScope scope;
  if (device < 0) device = current_device(binding);
  if (!ip.limit().reserve(device, bytes)) {
    ip.count_call(kind, false);
    ip.count_limit_rejection(origin(kind), bytes, device, stream);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  std::uint64_t extra = 0;  // bytes the driver handed out beyond `bytes` (pitch padding)
  const CUresult result = call(extra);
  if (result != CUDA_SUCCESS) {
    ip.limit().release(device, bytes);
    ip.count_call(kind, false);
    return result;
  }
  ip.limit().add(device, extra);
  ip.count_call(kind, true, bytes + extra);
  ip.record_alloc((ip.*table)(), origin(kind), *key, bytes + extra, device, stream);
  return result;
}

// Takes the record of `key`, makes the driver call, and settles the record by its result.
template <typename Call>
CUresult release(Kind kind, LiveAllocations& (Interposer::*table)(), std::uint64_t key,
                 CUstream stream, Call&& call) {
  Interposer& ip = Interposer::get();
  const DriverHookScope scope;
  // Taken before the call: once the driver has freed it, another thread may be handed the same
  // address and record it.
  const auto allocation = ip.take((ip.*table)(), key);
  const CUresult result = call();
  ip.count_call(kind, result == CUDA_SUCCESS);
  if (allocation) {
    if (result == CUDA_SUCCESS) {
      ip.record_free(origin(kind), *allocation, key, stream);
    } else {
      ip.restore((ip.*table)(), key, *allocation);
    }
  }
  return result;
}

}  // namespace

CUresult Entry<Kind::mem_alloc>::body(Binding& b, CUdeviceptr* dptr, size_t bytes) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  if (inside_driver_hook() || dptr == nullptr || bytes == 0) return real(dptr, bytes);
  return allocate(b, Kind::mem_alloc, &Interposer::allocations, dptr, bytes, -1, nullptr,
                  [&](std::uint64_t&) { return real(dptr, bytes); });
}

CUresult Entry<Kind::mem_alloc_pitch>::body(Binding& b, CUdeviceptr* dptr, size_t* pitch,
                                            size_t width, size_t height, unsigned int element) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  if (inside_driver_hook() || dptr == nullptr || pitch == nullptr || width == 0 || height == 0) {
    return real(dptr, pitch, width, height, element);
  }
  return allocate(b, Kind::mem_alloc_pitch, &Interposer::allocations, dptr, width * height, -1,
                  nullptr, [&](std::uint64_t& extra) {
                    const CUresult r = real(dptr, pitch, width, height, element);
                    if (r == CUDA_SUCCESS && *pitch > width) extra = (*pitch - width) * height;
                    return r;
                  });
}

CUresult Entry<Kind::mem_alloc_managed>::body(Binding& b, CUdeviceptr* dptr, size_t bytes,
                                              unsigned int flags) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  if (inside_driver_hook() || dptr == nullptr || bytes == 0) return real(dptr, bytes, flags);
  return allocate(b, Kind::mem_alloc_managed, &Interposer::allocations, dptr, bytes, -1, nullptr,
                  [&](std::uint64_t&) { return real(dptr, bytes, flags); });
}

CUresult Entry<Kind::mem_free>::body(Binding& b, CUdeviceptr dptr) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  if (inside_driver_hook() || dptr == 0) return real(dptr);
  return release(Kind::mem_free, &Interposer::allocations, dptr, nullptr,
                 [&] { return real(dptr); });
}

CUresult Entry<Kind::mem_create>::body(Binding& b, CUmemGenericAllocationHandle* handle,
                                       size_t bytes, const CUmemAllocationProp* prop,
                                       unsigned long long flags) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  // Physical memory on a device counts; host and NUMA-node allocations are not device memory.
  if (inside_driver_hook() || handle == nullptr || prop == nullptr || bytes == 0 ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return real(handle, bytes, prop, flags);
  }
  return allocate(b, Kind::mem_create, &Interposer::physical, handle, bytes, prop->location.id,
                  nullptr, [&](std::uint64_t&) { return real(handle, bytes, prop, flags); });
}

CUresult Entry<Kind::mem_release>::body(Binding& b, CUmemGenericAllocationHandle handle) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  if (inside_driver_hook()) return real(handle);
  return release(Kind::mem_release, &Interposer::physical, handle, nullptr,
                 [&] { return real(handle); });
}

CUresult Entry<Kind::mem_map>::body(Binding& b, CUdeviceptr ptr, size_t size, size_t offset,
                                    CUmemGenericAllocationHandle handle, unsigned long long flags) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  if (inside_driver_hook()) return real(ptr, size, offset, handle, flags);
  Interposer& ip = Interposer::get();
  const DriverHookScope scope;
  const CUresult result = real(ptr, size, offset, handle, flags);
  ip.count_call(Kind::mem_map, result == CUDA_SUCCESS, size);
  if (result == CUDA_SUCCESS) {
    // Mapping allocates nothing (cuMemCreate did); it is tracked to report mapped bytes.
    const auto physical = ip.physical().find(handle);
    const int device = physical ? physical->device : current_device(b);
    ip.mappings().insert(ptr, {size, device, 0, Kind::mem_map});
    ip.count_mapping(device, static_cast<std::int64_t>(size));
  }
  return result;
}

CUresult Entry<Kind::mem_unmap>::body(Binding& b, CUdeviceptr ptr, size_t size) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  if (inside_driver_hook()) return real(ptr, size);
  Interposer& ip = Interposer::get();
  const DriverHookScope scope;
  const auto mapping = ip.mappings().take(ptr);
  const CUresult result = real(ptr, size);
  ip.count_call(Kind::mem_unmap, result == CUDA_SUCCESS, size);
  if (mapping) {
    if (result == CUDA_SUCCESS) {
      ip.count_mapping(mapping->device, -static_cast<std::int64_t>(mapping->bytes));
    } else {
      ip.mappings().insert(ptr, *mapping);
    }
  }
  return result;
}

CUresult Entry<Kind::mem_alloc_async>::body(Binding& b, CUdeviceptr* dptr, size_t bytes,
                                            CUstream stream) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  if (inside_driver_hook() || dptr == nullptr || bytes == 0) return real(dptr, bytes, stream);
  return allocate(b, Kind::mem_alloc_async, &Interposer::allocations, dptr, bytes, -1, stream,
                  [&](std::uint64_t&) { return real(dptr, bytes, stream); });
}

CUresult Entry<Kind::mem_free_async>::body(Binding& b, CUdeviceptr dptr, CUstream stream) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  if (inside_driver_hook() || dptr == 0) return real(dptr, stream);
  return release(Kind::mem_free_async, &Interposer::allocations, dptr, stream,
                 [&] { return real(dptr, stream); });
}

CUresult Entry<Kind::mem_alloc_from_pool_async>::body(Binding& b, CUdeviceptr* dptr, size_t bytes,
                                                      CUmemoryPool pool, CUstream stream) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  if (inside_driver_hook() || dptr == nullptr || bytes == 0) {
    return real(dptr, bytes, pool, stream);
  }
  return allocate(b, Kind::mem_alloc_from_pool_async, &Interposer::allocations, dptr, bytes, -1,
                  stream, [&](std::uint64_t&) { return real(dptr, bytes, pool, stream); });
}

CUresult Entry<Kind::mem_get_info>::body(Binding& b, size_t* free, size_t* total) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  const CUresult result = real(free, total);
  if (inside_driver_hook()) return result;
  Interposer& ip = Interposer::get();
  ip.count_call(Kind::mem_get_info, result == CUDA_SUCCESS);
  if (result != CUDA_SUCCESS) return result;
  const DriverHookScope scope;
  const int device = current_device(b);
  if (total != nullptr) ip.telemetry().note_device_total(device, *total);
  if (!ip.limit().enabled()) return result;
  if (free != nullptr) *free = ip.limit().limited_free(device, *free);
  if (total != nullptr) *total = ip.limit().limited_total(*total);
  return result;
}

CUresult Entry<Kind::device_total_mem>::body(Binding& b, size_t* bytes, CUdevice device) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  const CUresult result = real(bytes, device);
  if (inside_driver_hook()) return result;
  Interposer& ip = Interposer::get();
  ip.count_call(Kind::device_total_mem, result == CUDA_SUCCESS);
  if (result == CUDA_SUCCESS && bytes != nullptr) {
    ip.telemetry().note_device_total(device, *bytes);
    *bytes = ip.limit().limited_total(*bytes);
  }
  return result;
}

}  // namespace tide::interpose
