// The state when a device allocation failed for lack of memory: recorded by the caching allocator
// (allocator/device/) and, for the allocations a memory limit refused, by the interposer; shown in
// the exported timeline.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

namespace tide::allocator::telemetry {

struct OomRecord {
  std::uint64_t t_ns = 0;
  std::uint64_t requested = 0;  // bytes asked for
  std::uint64_t rounded = 0;    // the block size that was needed
  CUstream stream = nullptr;
  std::uint64_t allocated = 0;    // live bytes
  std::uint64_t reserved = 0;     // bytes held from the driver (after releasing the cache)
  std::uint64_t limit = 0;        // the allocator's cap
  std::uint64_t device_free = 0;  // what the driver reported free
  std::uint64_t device_total = 0;
  std::uint64_t largest_free_block = 0;
  bool limit_reached = false;  // the cap, not the device, refused the memory
  std::string describe(int device) const;
};

}  // namespace tide::allocator::telemetry
