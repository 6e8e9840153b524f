// The runtime hooks (cudaMalloc and family): attribution, not accounting.
//
// The runtime allocates through the driver, whose hooks count and limit the memory; a runtime
// hook only marks the thread with the call in progress, so the driver hook charges the
// allocation to it. If the driver call underneath escaped the driver hooks (nothing was recorded
// on the thread during the call), the runtime hook records the allocation itself and applies
// the limit after the fact. Return codes are the runtime's own.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "interpose/bindings.h"
#include "interpose/hooks.h"
#include "interpose/interposer.h"
#include "interpose/thread_state.h"

namespace tide::interpose {
namespace {

constexpr cudaError_t kNoFunction = cudaErrorInitializationError;

bool passes_through() { return inside_driver_hook() || thread_state().runtime_call != Kind::count; }

int runtime_device(const void* runtime_function) {
  using GetDevice = cudaError_t (*)(int*);
  auto get = reinterpret_cast<GetDevice>(companion_symbol(runtime_function, "cudaGetDevice"));
  int device = 0;
  return get != nullptr && get(&device) == cudaSuccess ? device : 0;
}

// Runs the runtime call as `kind`, then records the allocation at *ptr if no driver hook did.
template <typename Call>
cudaError_t allocate(Binding& b, Kind kind, void** ptr, const std::uint64_t& bytes,
                     cudaStream_t stream, Call&& call) {
  Interposer& ip = Interposer::get();
  ThreadState& thread = thread_state();
  const std::uint64_t before = thread.driver_records;
  thread.runtime_call = kind;
  const cudaError_t result = call();
  thread.runtime_call = Kind::count;
  ip.count_call(kind, result == cudaSuccess, bytes);
  if (result != cudaSuccess || ptr == nullptr || *ptr == nullptr ||
      thread.driver_records != before) {
    return result;
  }
  ip.count_runtime_fallback();
  const void* real = b.real.load(std::memory_order_acquire);
  const int device = runtime_device(real);
  if (!ip.limit().reserve(device, bytes)) {
    using Free = cudaError_t (*)(void*);
    if (auto free = reinterpret_cast<Free>(companion_symbol(real, "cudaFree"))) free(*ptr);
    *ptr = nullptr;
    ip.count_limit_rejection(kind, bytes, device, stream);
    return cudaErrorMemoryAllocation;
  }
  ip.record_alloc(ip.allocations(), kind, reinterpret_cast<std::uintptr_t>(*ptr), bytes, device,
                  stream);
  return result;
}

template <typename Call>
cudaError_t release(Kind kind, void* ptr, cudaStream_t stream, Call&& call) {
  Interposer& ip = Interposer::get();
  ThreadState& thread = thread_state();
  const std::uint64_t before = thread.driver_records;
  thread.runtime_call = kind;
  const cudaError_t result = call();
  thread.runtime_call = Kind::count;
  ip.count_call(kind, result == cudaSuccess);
  if (result == cudaSuccess && ptr != nullptr && thread.driver_records == before) {
    const auto key = reinterpret_cast<std::uintptr_t>(ptr);
    if (auto allocation = ip.take(ip.allocations(), key)) {
      ip.record_free(kind, *allocation, key, stream);
    }
  }
  return result;
}

}  // namespace

cudaError_t Entry<Kind::rt_malloc>::body(Binding& b, void** ptr, size_t size) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  if (passes_through()) return real(ptr, size);
  return allocate(b, Kind::rt_malloc, ptr, size, nullptr, [&] { return real(ptr, size); });
}

cudaError_t Entry<Kind::rt_malloc_pitch>::body(Binding& b, void** ptr, size_t* pitch, size_t width,
                                               size_t height) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  if (passes_through()) return real(ptr, pitch, width, height);
  std::uint64_t bytes = width * height;
  return allocate(b, Kind::rt_malloc_pitch, ptr, bytes, nullptr, [&] {
    const cudaError_t r = real(ptr, pitch, width, height);
    if (r == cudaSuccess && pitch != nullptr) bytes = *pitch * height;
    return r;
  });
}

cudaError_t Entry<Kind::rt_malloc_managed>::body(Binding& b, void** ptr, size_t size,
                                                 unsigned int flags) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  if (passes_through()) return real(ptr, size, flags);
  return allocate(b, Kind::rt_malloc_managed, ptr, size, nullptr,
                  [&] { return real(ptr, size, flags); });
}

cudaError_t Entry<Kind::rt_malloc_async>::body(Binding& b, void** ptr, size_t size,
                                               cudaStream_t stream) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  if (passes_through()) return real(ptr, size, stream);
  return allocate(b, Kind::rt_malloc_async, ptr, size, stream,
                  [&] { return real(ptr, size, stream); });
}

cudaError_t Entry<Kind::rt_malloc_from_pool_async>::body(Binding& b, void** ptr, size_t size,
                                                         cudaMemPool_t pool, cudaStream_t stream) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  if (passes_through()) return real(ptr, size, pool, stream);
  return allocate(b, Kind::rt_malloc_from_pool_async, ptr, size, stream,
                  [&] { return real(ptr, size, pool, stream); });
}

cudaError_t Entry<Kind::rt_free>::body(Binding& b, void* ptr) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  if (passes_through()) return real(ptr);
  return release(Kind::rt_free, ptr, nullptr, [&] { return real(ptr); });
}

cudaError_t Entry<Kind::rt_free_async>::body(Binding& b, void* ptr, cudaStream_t stream) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return kNoFunction;
  if (passes_through()) return real(ptr, stream);
  return release(Kind::rt_free_async, ptr, stream, [&] { return real(ptr, stream); });
}

}  // namespace tide::interpose
