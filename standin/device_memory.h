// Device memory: the capacity of each device, and cuMemAlloc'd buffers.
//
// A buffer is an anonymous private mapping of host memory, reserved but never touched here, so
// that a large capacity costs nothing until it is used. Capacity is counted in bytes asked for
// (cuMemAlloc) and in granularity multiples (cuMemCreate, virtual_memory.h).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "standin/streams.h"

namespace tide::standin {

class MemoryAccount {
 public:
  explicit MemoryAccount(std::uint64_t capacity) : capacity_(capacity) {}

  // False, and nothing charged, when `bytes` more would exceed the capacity.
  bool charge(std::uint64_t bytes);
  void refund(std::uint64_t bytes);

  std::uint64_t used() const;
  std::uint64_t peak() const;
  std::uint64_t capacity() const;
  void set_capacity(std::uint64_t bytes);
  void reset_peak();

 private:
  mutable std::mutex mutex_;
  std::uint64_t capacity_;
  std::uint64_t used_ = 0;
  std::uint64_t peak_ = 0;
};

// Charges `bytes` to `device` and to the total; false (nothing charged) when over capacity.
bool charge(int device, std::uint64_t bytes);
void refund(int device, std::uint64_t bytes);

// All devices together, for the statistics.
struct DeviceBytes {
  std::uint64_t used;
  std::uint64_t peak;
};
DeviceBytes device_bytes();
void reset_device_peak();

// `low`: the legacy 32-bit cuMemAlloc, whose pointer must fit in 32 bits (MAP_32BIT).
CUresult mem_alloc(CUdeviceptr* out, std::size_t bytes, bool low = false);
CUresult mem_free(CUdeviceptr ptr);
CUresult mem_alloc_async(CUdeviceptr* out, std::size_t bytes, CUstream stream,
                         DefaultStream fallback);
CUresult mem_free_async(CUdeviceptr ptr, CUstream stream, DefaultStream fallback);
CUresult mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes);

struct Allocation {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  int device = 0;
};
// The cuMemAlloc'd buffer holding `ptr`, if any.
bool find_allocation(std::uintptr_t ptr, Allocation* out);
// Whether [ptr, ptr + bytes) lies within one cuMemAlloc'd buffer.
bool in_allocation(std::uintptr_t ptr, std::size_t bytes);

// Frees what cuMemAlloc gave out on `device` (its primary context is being destroyed).
void free_allocations_of(int device);

}  // namespace tide::standin
