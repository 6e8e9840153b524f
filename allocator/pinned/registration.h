// Registering chunks with the CUDA driver (page-locking them), through driver/.
//
// cuMemHostRegister and cuMemHostUnregister need a current context; chunks are registered from
// whatever thread jemalloc's hooks run on, so a registrar holds a share of the device's primary
// context and makes it current around its calls (driver::ContextScope: the thread's own is back
// afterwards).
// Without a driver, a registrar registers nothing and says so once per process.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "driver/context.h"

namespace tide::allocator::pinned {

class Registrar {
 public:
  // Loads the driver (driver::cuda()) and retains `device`'s primary context. Without a driver
  // (DriverNotFound), pinned() is false and a message on stderr says, once per process, that
  // pinned arenas hold ordinary pageable memory. Throws std::invalid_argument for a device the
  // driver does not have, CudaError if the driver fails.
  explicit Registrar(int device);

  bool pinned() const { return context_.has_value(); }

  // cuMemHostRegister(PORTABLE) of a whole chunk; throws CudaError. No-op when not pinned.
  void register_chunk(void* base, std::size_t bytes);
  // cuMemHostUnregister; false if the driver refused (the caller counts it). Never throws.
  bool unregister_chunk(void* base) noexcept;

  std::uint64_t register_ns() const { return register_ns_.load(std::memory_order_relaxed); }
  std::uint64_t unregister_ns() const { return unregister_ns_.load(std::memory_order_relaxed); }

 private:
  std::optional<driver::PrimaryContext> context_;  // none: no driver
  std::atomic<std::uint64_t> register_ns_{0};
  std::atomic<std::uint64_t> unregister_ns_{0};
};

}  // namespace tide::allocator::pinned
