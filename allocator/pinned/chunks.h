// The chunk pool under a pinned arena: large chunks of host memory, each mapped, touched and
// registered with the driver once, and carved into page-granular ranges for two clients:
// jemalloc's extent hooks (extents that jemalloc splits into size classes) and direct buffers
// (large requests placed here without size classes, rounded up to a page only).
//
// A range never crosses a chunk boundary, so everything handed out lies in one registration.
// A chunk is unregistered only when it is unmapped: when it becomes wholly free and the pool
// already keeps `retain_bytes` of free chunks, or when the pool is destroyed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "allocator/pinned/memory.h"
#include "allocator/pinned/options.h"

namespace tide::allocator::pinned {

class Registrar;

struct ChunkInfo {
  void* base;
  std::size_t bytes;
  std::size_t used;  // handed out, as extents or buffers
  bool dedicated;    // made for one large buffer
};

struct ChunkPoolStats {
  std::uint64_t pinned_bytes = 0;  // all chunks (registered, or only mapped when unpinned)
  std::uint64_t peak_pinned_bytes = 0;
  std::uint64_t chunks = 0;
  std::uint64_t chunks_mapped = 0;     // since the pool was made
  std::uint64_t chunks_released = 0;   // unregistered and unmapped
  std::uint64_t extent_bytes = 0;      // handed to jemalloc (its slabs, large extents, metadata)
  std::uint64_t buffer_bytes = 0;      // direct buffers, page-rounded
  std::uint64_t free_chunk_bytes = 0;  // wholly free chunks kept for reuse
  std::uint64_t touch_ns = 0;
  std::uint64_t unregister_failures = 0;
};

class ChunkPool {
 public:
  ChunkPool(const PinnedOptions& options, Registrar& registrar);
  // Unregisters and unmaps every chunk, whatever is still handed out.
  ~ChunkPool();
  ChunkPool(const ChunkPool&) = delete;
  ChunkPool& operator=(const ChunkPool&) = delete;

  // For the extent hooks: `bytes` (a multiple of kPage) at `alignment` (a power of two, at most
  // kHugePage). Throws std::bad_alloc, CudaError when registering a new chunk fails, or
  // PinnedLimitError past the rank's share of TIDE_NODE_PINNED_LIMIT (node_limit.h).
  void* allocate_extent(std::size_t bytes, std::size_t alignment);
  // Any page range inside what allocate_extent gave (jemalloc splits and merges extents).
  void deallocate_extent(void* p, std::size_t bytes) noexcept;

  // A direct buffer of `requested` bytes (rounded up to a page). Throws like allocate_extent.
  void* allocate_buffer(std::size_t requested, std::size_t alignment);
  // Throws std::invalid_argument unless `p` is a live direct buffer of `requested` bytes.
  void deallocate_buffer(void* p, std::size_t requested);

  // Whether two addresses lie in the same chunk: jemalloc may merge extents only then.
  bool same_chunk(const void* a, const void* b) const;
  // Whether `p` lies in a chunk, outside every direct buffer and free range: where a pointer
  // jemalloc gave can be (a cheap guard against freeing a foreign pointer through jemalloc).
  bool holds_extent_pointer(const void* p) const;

  // Unregisters and unmaps every wholly free chunk now.
  void release_free_chunks();

  ChunkPoolStats stats() const;
  std::vector<ChunkInfo> chunks() const;
  bool pinned() const;

 private:
  struct Chunk {
    std::size_t bytes;
    std::size_t used = 0;
    bool dedicated = false;
    bool kept = false;  // wholly free and counted in free_chunk_bytes
  };
  struct Buffer {
    std::size_t bytes;      // the page-rounded range
    std::size_t requested;  // what the caller asked for
  };
  using ChunkMap = std::map<std::uintptr_t, Chunk>;

  void* allocate_range(std::size_t bytes, std::size_t alignment, bool may_dedicate);
  void deallocate_range(std::uintptr_t p, std::size_t bytes) noexcept;
  std::uintptr_t take_locked(std::size_t bytes, std::size_t alignment);
  void add_free_locked(std::uintptr_t p, std::size_t bytes);
  void remove_free_locked(std::uintptr_t p, std::size_t bytes);
  ChunkMap::iterator chunk_of_locked(std::uintptr_t p);
  ChunkMap::const_iterator chunk_of_locked(std::uintptr_t p) const;
  std::size_t next_regular_bytes_locked(std::size_t bytes) const;
  // Moves every wholly free chunk out of the pool, for release() once the lock is dropped.
  void take_free_chunks_locked(std::vector<std::pair<std::uintptr_t, std::size_t>>& out);
  void release(std::uintptr_t base, std::size_t bytes) noexcept;

  const PinnedOptions options_;
  const ChunkPlacement placement_;
  Registrar& registrar_;

  std::mutex grow_mutex_;  // one new chunk at a time: mapping and registering are slow
  mutable std::mutex mutex_;
  ChunkMap chunks_;                                           // by base address
  std::map<std::uintptr_t, std::size_t> free_;                // free ranges by address
  std::set<std::pair<std::size_t, std::uintptr_t>> by_size_;  // the same, best fit first
  std::map<std::uintptr_t, Buffer> buffers_;                  // live direct buffers, by address
  std::size_t regular_bytes_ = 0;                             // chunks that are not dedicated
  ChunkPoolStats stats_;
};

}  // namespace tide::allocator::pinned
