// Page-locked host memory: cuMemHostRegister'd ranges and cuMemHostAlloc'd buffers. Nothing is
// really locked; the stand-in only tracks the ranges, so that copies can tell page-locked host
// memory from pageable memory as CUDA does.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace tide::standin {

CUresult host_register(void* ptr, std::size_t bytes, unsigned flags);
CUresult host_unregister(void* ptr);
CUresult host_alloc(void** out, std::size_t bytes, unsigned flags);
CUresult free_host(void* ptr);

// Whether all of [ptr, ptr + bytes) is in one registered range or host allocation.
bool is_page_locked(const void* ptr, std::size_t bytes);

struct PinnedRange {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  bool read_only = false;  // CU_MEMHOSTREGISTER_READ_ONLY: the device may not write it
};
// The registered range or host allocation holding `ptr`, if any.
bool find_page_locked(const void* ptr, PinnedRange* out);

// Drops the registrations made in `device`'s primary context (it is being destroyed), as CUDA
// does. cuMemHostAlloc'd memory stays: freeing it under the caller would only turn a leak into a
// crash.
void unregister_host_memory_of(int device);

struct PinnedBytes {
  std::uint64_t registered;
  std::uint64_t allocated;
};
PinnedBytes pinned_bytes();

}  // namespace tide::standin
