// A per-thread cache of small free blocks in front of the caching allocator's locked core.
//
// A training step allocates and frees many short-lived small tensors; with one lock per device,
// two threads doing so (the Python thread and autograd's device thread) would hand the lock's
// cache line back and forth on every call. A block freed into the cache of the freeing thread
// is handed out again by that thread, for the same stream and the same rounded size, without the
// core's lock: stream order is kept because a block is only reused on the stream it was freed on.
//
// The cache holds blocks of the small pool only (rounded size <= 1 MiB, where a block's size is
// exactly its rounded request), at most `capacity` bytes. The core still counts a cached block
// as allocated; the statistics and the telemetry subtract what the caches hold, from counters
// each cache keeps (written by its owner, read by anyone). A spin lock, uncontended except while
// another thread empties the cache (empty_cache, out of memory, thread exit), guards it.
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tide::allocator::device {

// Aligned to a cache line, and a whole number of them: every thread writes its own cache's lock
// and counters on each pair, and two caches allocated one after the other must not share a line
// (false sharing made two threads' pairs twice as slow as one thread's).
class alignas(64) ThreadCache {
 public:
  struct Entry {
    CUdeviceptr ptr = 0;
    std::size_t size = 0;       // the block's size (its rounded request)
    std::size_t requested = 0;  // what was asked for when it was last allocated
    CUstream stream = nullptr;
  };
  enum class Put { kCached, kCachedEvicted, kRejected, kAlreadyCached };

  explicit ThreadCache(std::size_t capacity) : capacity_(capacity) {}

  // A cached block of `size` bytes freed on `stream`, or 0.
  CUdeviceptr take(std::size_t size, CUstream stream, std::size_t requested);
  // Caches a freed block. kCachedEvicted: an older block had to leave, in *evicted, for the core.
  // kRejected: the cache is full; the core takes the block. kAlreadyCached: the block is in the
  // cache already (freed twice).
  Put put(const Entry& entry, Entry* evicted);
  // Empties the cache into `out` (any thread).
  void drain(std::vector<Entry>* out);

  // Counters, read without the lock (relaxed: statistics).
  std::uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  std::uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  // Requested bytes of the blocks the cache handed out and took back.
  std::uint64_t alloc_hit_requested() const {
    return alloc_hit_requested_.load(std::memory_order_relaxed);
  }
  std::uint64_t free_hit_requested() const {
    return free_hit_requested_.load(std::memory_order_relaxed);
  }
  std::uint64_t alloc_hits() const { return alloc_hits_.load(std::memory_order_relaxed); }
  std::uint64_t alloc_hit_bytes() const { return alloc_hit_bytes_.load(std::memory_order_relaxed); }
  std::uint64_t free_hits() const { return free_hits_.load(std::memory_order_relaxed); }
  std::uint64_t free_hit_bytes() const { return free_hit_bytes_.load(std::memory_order_relaxed); }
  void reset_accumulated();

  // The owner's net change of live bytes through the cache since the allocator last heard of it:
  // the telemetry hears of a climb or fall through the cache once it reaches its resolution.
  // Only the owning thread touches it.
  std::int64_t note(std::int64_t delta) { return unreported_ += delta; }
  void reported() { unreported_ = 0; }

 private:
  static constexpr std::size_t kBins = 64;
  static constexpr std::size_t kSlots = 4;
  struct Bin {
    std::array<Entry, kSlots> entries;
    std::size_t used = 0;  // entries[0..used), oldest first
  };

  void lock() {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      while (locked_.load(std::memory_order_relaxed)) {
      }
    }
  }
  void unlock() { locked_.store(false, std::memory_order_release); }
  // Fibonacci hashing of the size in 512-byte units: power-of-two sizes spread over the bins.
  static std::size_t bin_of(std::size_t size) {
    return static_cast<std::size_t>(((size >> 9) * 0x9E3779B97F4A7C15ull) >> 58);  // 64 bins
  }
  // Writers hold the lock, so a load and a store are enough (no read-modify-write).
  static void bump(std::atomic<std::uint64_t>& c, std::uint64_t n) {
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  static void drop(std::atomic<std::uint64_t>& c, std::uint64_t n) {
    c.store(c.load(std::memory_order_relaxed) - n, std::memory_order_relaxed);
  }

  const std::size_t capacity_;
  std::atomic<bool> locked_{false};
  std::array<Bin, kBins> bins_{};
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::uint64_t> count_{0};
  std::atomic<std::uint64_t> alloc_hit_requested_{0};
  std::atomic<std::uint64_t> free_hit_requested_{0};
  std::atomic<std::uint64_t> alloc_hits_{0};
  std::atomic<std::uint64_t> alloc_hit_bytes_{0};
  std::atomic<std::uint64_t> free_hits_{0};
  std::atomic<std::uint64_t> free_hit_bytes_{0};
  std::int64_t unreported_ = 0;
};

}  // namespace tide::allocator::device
