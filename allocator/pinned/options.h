// What a pinned host arena is configured with, and the defaults the TIDE_PINNED_* variables give.
#pragma once

#include <cstddef>

namespace tide::allocator::pinned {

inline constexpr std::size_t kMiB = std::size_t{1} << 20;

struct PinnedOptions {
  // Regular chunks (those that hold jemalloc's extents and mid-sized buffers) start small and
  // grow with the arena up to this size. Every chunk is one registration with the driver.
  std::size_t chunk_bytes = 256 * kMiB;
  // Requests of at least this many bytes skip jemalloc's size classes (up to 25% rounding): they
  // are placed in the chunks directly, rounded up to a page only.
  std::size_t direct_bytes = 1 * kMiB;
  // Wholly free chunks kept mapped and registered for reuse, at most this many bytes; beyond
  // that, a chunk that becomes free is unregistered and unmapped at once.
  std::size_t retain_bytes = 256 * kMiB;
  // NUMA node the chunks' pages are bound to (mbind), or -1 for the kernel's default placement.
  int numa_node = -1;
  // Device whose primary context registers the chunks (the registration is portable: every
  // context can use the memory).
  int device = 0;
  // madvise(MADV_HUGEPAGE) on chunks: fewer pages to fault, pin and map.
  bool huge_pages = true;
  // Threads that touch a new chunk's pages before it is registered; 0: min(8, cores).
  int touch_threads = 0;

  // Defaults overridden by TIDE_PINNED_CHUNK, _DIRECT, _RETAIN, _NUMA_NODE, _HUGEPAGES and
  // _TOUCH_THREADS. Throws config::EnvError for a bad value.
  static PinnedOptions from_environment();

  // Throws std::invalid_argument naming the field that is out of range.
  void validate() const;

  // Requests of at least this size that fit nowhere get a chunk of their own, sized to them:
  // packing them into regular chunks would leave gaps of up to their size at chunk ends.
  std::size_t dedicated_bytes() const { return chunk_bytes / 64; }
};

}  // namespace tide::allocator::pinned
