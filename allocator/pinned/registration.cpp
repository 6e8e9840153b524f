#include "allocator/pinned/registration.h"

#include <chrono>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>

#include "driver/context.h"
#include "driver/cuda_api.h"
#include "driver/error.h"

namespace tide::allocator::pinned {
namespace {

std::uint64_t nanoseconds_since(std::chrono::steady_clock::time_point t0) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count());
}

void say_not_pinned(const char* why) {
  static std::once_flag once;
  std::call_once(once, [why] {
    std::fprintf(stderr,
                 "tide: pinned host arenas are NOT pinned: %s\n"
                 "tide: their memory is ordinary pageable host memory; copies to and from the GPU "
                 "will be neither fast nor asynchronous.\n",
                 why);
  });
}

}  // namespace

Registrar::Registrar(int device) {
  try {
    driver::cuda();
  } catch (const driver::DriverNotFound& e) {
    say_not_pinned(e.what());
    return;
  }
  if (device >= driver::device_count()) {
    throw std::invalid_argument("tide: pinned arena: no device " + std::to_string(device) +
                                " (the driver has " + std::to_string(driver::device_count()) + ")");
  }
  context_.emplace(device);
}

void Registrar::register_chunk(void* base, std::size_t bytes) {
  if (!context_) return;
  const auto t0 = std::chrono::steady_clock::now();
  {
    const driver::ContextScope scope(*context_);
    TIDE_CU(cuMemHostRegister, base, bytes, CU_MEMHOSTREGISTER_PORTABLE);
  }
  register_ns_.fetch_add(nanoseconds_since(t0), std::memory_order_relaxed);
}

bool Registrar::unregister_chunk(void* base) noexcept {
  if (!context_) return true;
  const auto t0 = std::chrono::steady_clock::now();
  bool ok = false;
  try {
    const driver::ContextScope scope(*context_);
    ok = driver::cuda().cuMemHostUnregister(base) == CUDA_SUCCESS;
  } catch (...) {
    ok = false;
  }
  unregister_ns_.fetch_add(nanoseconds_since(t0), std::memory_order_relaxed);
  return ok;
}

}  // namespace tide::allocator::pinned
