// A pinned host arena: a jemalloc arena whose extents come from chunks registered with the CUDA
// driver (chunks.h), plus direct buffers for large requests, which skip jemalloc's size
// classes. Thread-safe: allocate and deallocate may be called from any thread at once.
//
// Where the memory comes from, by request size:
//   below options.direct_bytes (1 MiB): jemalloc (MALLOCX_ARENA, no thread cache), whose size
//     classes round up by up to 25%, from extents the extent hooks carve out of chunks;
//   from direct_bytes up: a page-rounded range of a chunk, best fit; a request that fits nowhere
//     and is at least chunk_bytes / 64 (4 MiB), or more than a quarter of the next regular chunk,
//     gets a chunk of its own size (chunks.cpp).
// The arena itself (create, destroy) is not to be used from other threads while it is destroyed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "allocator/pinned/chunks.h"
#include "allocator/pinned/options.h"
#include "allocator/pinned/stats.h"

namespace tide::allocator::pinned {

class Registrar;
struct PinnedExtentHooks;

class PinnedArena {
 public:
  // Default alignment: a cache line, and an AVX-512 vector.
  static constexpr std::size_t kDefaultAlignment = 64;

  // Throws std::invalid_argument for bad options, CudaError if the driver fails. Without a
  // driver the arena works on ordinary host memory (pinned() is false; said once on stderr).
  explicit PinnedArena(const PinnedOptions& options = PinnedOptions::from_environment());
  // Destroys the jemalloc arena and unregisters and unmaps every chunk: memory still allocated
  // from the arena is gone with it.
  ~PinnedArena();
  PinnedArena(const PinnedArena&) = delete;
  PinnedArena& operator=(const PinnedArena&) = delete;

  // `bytes` (0: returns null) aligned to `alignment` (a power of two up to 2 MiB; 0: 64).
  // Throws std::bad_alloc, or CudaError when registering a new chunk fails.
  void* allocate(std::size_t bytes, std::size_t alignment = 0);
  // `bytes` must be what allocate() was given for `p` (null: nothing to do). Throws
  // std::invalid_argument for a pointer that cannot be one of this arena's.
  void deallocate(void* p, std::size_t bytes);

  // Returns what jemalloc caches to the chunks and unregisters and unmaps wholly free chunks.
  void trim();

  PinnedStats stats() const;
  std::vector<ChunkInfo> chunks() const { return pool_->chunks(); }
  bool pinned() const;
  const PinnedOptions& options() const { return options_; }
  unsigned jemalloc_arena() const { return arena_; }

 private:
  void destroy_jemalloc_arena() noexcept;
  void mallctl_arena(const char* name, void* out, std::size_t* out_len, void* in,
                     std::size_t in_len) const;

  const PinnedOptions options_;
  std::unique_ptr<Registrar> registrar_;
  std::unique_ptr<ChunkPool> pool_;
  std::unique_ptr<PinnedExtentHooks> hooks_;
  unsigned arena_ = 0;
  int flags_ = 0;  // MALLOCX_ARENA(arena_) | MALLOCX_TCACHE_NONE

  std::atomic<std::uint64_t> requested_{0};
  std::atomic<std::uint64_t> peak_requested_{0};
  std::atomic<std::uint64_t> allocations_{0};
  std::atomic<std::uint64_t> frees_{0};
};

}  // namespace tide::allocator::pinned
