// The optional device memory limit (TIDE_MEMORY_LIMIT): a cap per device on the bytes this
// process holds through the hooked allocation calls.
//
// An allocation first reserves its bytes here and only then calls the driver, so concurrent
// allocations can never overshoot the limit together; a failed driver call gives them back.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "interpose/memory_events.h"

namespace tide::interpose {

class MemoryLimit {
 public:
  explicit MemoryLimit(std::uint64_t limit_bytes) : limit_(limit_bytes) {}

  bool enabled() const { return limit_ != 0; }
  std::uint64_t limit() const { return limit_; }

  // False (and nothing reserved) when `bytes` more would exceed the limit on `device`.
  bool reserve(int device, std::uint64_t bytes);
  void release(int device, std::uint64_t bytes);
  // Counts bytes the driver handed out beyond what was reserved (pitch padding), unchecked.
  void add(int device, std::uint64_t bytes);
  std::uint64_t used(int device) const;

  // What cuMemGetInfo and cuDeviceTotalMem report under the limit.
  std::uint64_t limited_total(std::uint64_t total) const;
  std::uint64_t limited_free(int device, std::uint64_t free) const;

  void reset();  // fork child: the parent's allocations are not the child's

 private:
  std::atomic<std::uint64_t>* slot(int device);
  const std::atomic<std::uint64_t>* slot(int device) const;

  const std::uint64_t limit_;
  std::array<std::atomic<std::uint64_t>, kMaxDevices> used_{};
};

}  // namespace tide::interpose
