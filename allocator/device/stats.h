// The caching allocator's statistics, named and counted as PyTorch's CUDA caching allocator
// names and counts them where the meaning is the same (memory_stats() keys such as
// "allocated_bytes.all.current").
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace tide::allocator::device {

// One quantity: its current value, its peak since the last reset, and the totals added and
// removed since the last reset of the accumulated counters.
struct Stat {
  std::uint64_t current = 0;
  std::uint64_t peak = 0;
  std::uint64_t allocated = 0;
  std::uint64_t freed = 0;

  void add(std::uint64_t n) {
    current += n;
    allocated += n;
    peak = std::max(peak, current);
  }
  void sub(std::uint64_t n) {
    current -= n;
    freed += n;
  }
  void reset_peak() { peak = current; }
  void reset_accumulated() {
    allocated = 0;
    freed = 0;
  }
};

// Index 0: all pools, 1: the small pool (blocks up to 1 MiB), 2: the large pool.
enum StatPool : int { kAllPools = 0, kSmallPool = 1, kLargePool = 2 };
using StatArray = std::array<Stat, 3>;

struct AllocatorStats {
  StatArray allocated_bytes;  // blocks handed out (rounded sizes)
  StatArray requested_bytes;  // what callers asked for
  StatArray reserved_bytes;   // held from the driver (segments, backed pages)
  StatArray active_bytes;     // allocated, or freed but awaiting other streams' events
  StatArray allocation;       // number of blocks handed out
  StatArray active;           // number of active blocks
  StatArray segment;          // number of segments
  std::array<std::uint64_t, 3> inactive_split_bytes{};  // free blocks in partly used segments
  std::array<std::uint64_t, 3> inactive_split{};
  std::uint64_t num_alloc_retries = 0;     // allocations that released the cache and retried
  std::uint64_t num_ooms = 0;              // allocations that failed for lack of memory
  std::uint64_t num_sync_all_streams = 0;  // waits for all pending frees before releasing
  std::uint64_t num_device_alloc = 0;      // driver allocation calls (cuMemAlloc, cuMemCreate)
  std::uint64_t num_device_free = 0;       // driver free calls (cuMemFree, cuMemRelease)
  std::uint64_t memory_limit = 0;          // cap on reserved bytes
  std::uint64_t thread_cached_bytes = 0;   // small free blocks held in threads' caches
  // Allocations served from threads' caches, without the lock (accumulated: reset with the
  // totals); of allocation[kSmallPool].allocated, the rest took the lock.
  std::uint64_t thread_cache_hits = 0;
  std::uint64_t largest_free_block = 0;
  std::uint64_t growable = 0;  // 1 when the large pool grows through VMM
};

}  // namespace tide::allocator::device
