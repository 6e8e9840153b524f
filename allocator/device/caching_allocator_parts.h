// What the files of the caching allocator's implementation share (caching_allocator*.cpp, one
// concept each: the front door and its blocks, thread caches, stream order, growth and release,
// the out-of-memory path, statistics, telemetry). Not for other code.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "allocator/device/block.h"
#include "allocator/device/caching_allocator.h"
#include "allocator/device/stats.h"
#include "driver/error.h"

namespace tide::allocator::device {

inline void* to_void(CUdeviceptr p) {
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
}
inline CUdeviceptr to_device(void* p) {
  return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
}
inline int pool_index(PoolKind pool) { return pool == PoolKind::kSmall ? 0 : 1; }
inline int stat_index(PoolKind pool) { return pool == PoolKind::kSmall ? kSmallPool : kLargePool; }
inline std::size_t align_up(std::size_t n, std::size_t m) { return (n + m - 1) / m * m; }
inline std::size_t align_down(std::size_t n, std::size_t m) { return n / m * m; }
inline std::uint64_t saturating_sub(std::uint64_t a, std::uint64_t b) { return a > b ? a - b : 0; }
inline bool is_out_of_memory(const driver::CudaError& e) {
  return e.result() == CUDA_ERROR_OUT_OF_MEMORY;
}

// What the threads' caches hold and have served, summed: the core counts cached blocks as
// allocated, and stats() and the peaks subtract this.
struct CachingAllocator::Corrections {
  std::uint64_t bytes = 0;
  std::uint64_t count = 0;
  std::uint64_t alloc_hits = 0;
  std::uint64_t alloc_hit_bytes = 0;
  std::uint64_t alloc_hit_requested = 0;
  std::uint64_t free_hits = 0;
  std::uint64_t free_hit_bytes = 0;
  std::uint64_t free_hit_requested = 0;
};

// Inline: it is on the path of every free (caching_allocator.cpp) as well as of stream order's.
inline void CachingAllocator::deactivate_locked(Block* block) {
  for (int i : {static_cast<int>(kAllPools), stat_index(block->pool)}) {
    active_bytes_[i].sub(block->size);
    active_[i].sub(1);
  }
  free_block_locked(block);
}

// Allocators alive in the process, by id (caching_allocator_thread_caches.cpp): a thread's cache
// slots name allocators by id, and a thread that exits gives its caches back only to allocators
// still alive.
std::uint64_t new_allocator_id();
void add_live_allocator(std::uint64_t id, CachingAllocator* allocator);
void remove_live_allocator(std::uint64_t id);

}  // namespace tide::allocator::device
