// What a pinned arena reports: what was asked of it, what that occupies, what is pinned for it,
// and what pinning cost. The C ABI's tide_pinned_stats has the same fields in the same order.
#pragma once

#include <cstdint>

namespace tide::allocator::pinned {

struct PinnedStats {
  // Live allocations: the bytes callers asked for, and the peak of that.
  std::uint64_t requested_bytes = 0;
  std::uint64_t peak_requested_bytes = 0;
  // What live allocations occupy: jemalloc's size classes plus direct buffers rounded to pages.
  std::uint64_t allocated_bytes = 0;
  // jemalloc's own count of its live allocations in this arena (stats.arenas.<i>.*.allocated).
  std::uint64_t jemalloc_allocated_bytes = 0;
  // Extents jemalloc holds: its allocations, the free memory it caches, its metadata.
  std::uint64_t jemalloc_extent_bytes = 0;
  // Direct buffers (requests of at least direct_bytes), page-rounded.
  std::uint64_t direct_bytes = 0;
  // Chunks: registered with the driver (mapped only, when there is no driver).
  std::uint64_t pinned_bytes = 0;
  std::uint64_t peak_pinned_bytes = 0;
  std::uint64_t free_chunk_bytes = 0;  // wholly free chunks kept for reuse
  std::uint64_t chunks = 0;
  std::uint64_t chunks_mapped = 0;    // since the arena was made
  std::uint64_t chunks_released = 0;  // unregistered and unmapped
  std::uint64_t unregister_failures = 0;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  // Time spent page-locking: registering chunks, unregistering them, touching their pages first.
  std::uint64_t register_ns = 0;
  std::uint64_t unregister_ns = 0;
  std::uint64_t touch_ns = 0;
  // 1 if the chunks are registered with a CUDA driver, 0 if they are ordinary host memory.
  std::uint64_t pinned = 0;
};

}  // namespace tide::allocator::pinned
