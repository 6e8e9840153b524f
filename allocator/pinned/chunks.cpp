#include "allocator/pinned/chunks.h"

#include <algorithm>
#include <cassert>
#include <new>
#include <stdexcept>

#include "allocator/pinned/memory_error.h"
#include "allocator/pinned/node_limit.h"
#include "allocator/pinned/registration.h"
#include "config/bytes.h"
#include "driver/error.h"

namespace tide::allocator::pinned {
namespace {

constexpr std::size_t kMinRegularChunk = 4 * kMiB;
// A new regular chunk is this fraction of the regular chunks so far (at least 4 MiB, at most
// chunk_bytes): small arenas stay small, large ones do not register thousands of chunks, and the
// unused end of the newest chunk stays a bounded share of the whole.
constexpr std::size_t kRegularGrowthDivisor = 8;
// Requests larger than this fraction of the next regular chunk get a chunk of their own size.
constexpr std::size_t kDedicateFraction = 4;
// Best fit scans at most this many candidates for one with room for an unusual alignment.
constexpr int kMaxAlignedCandidates = 64;

}  // namespace

ChunkPool::ChunkPool(const PinnedOptions& options, Registrar& registrar)
    : options_(options),
      placement_{options.numa_node, options.huge_pages,
                 resolve_touch_threads(options.touch_threads)},
      registrar_(registrar) {}

ChunkPool::~ChunkPool() {
  for (const auto& [base, chunk] : chunks_) release(base, chunk.bytes);
}

bool ChunkPool::pinned() const { return registrar_.pinned(); }

void* ChunkPool::allocate_extent(std::size_t bytes, std::size_t alignment) {
  void* p = allocate_range(bytes, alignment, /*may_dedicate=*/false);
  const std::lock_guard lock(mutex_);
  stats_.extent_bytes += bytes;
  return p;
}

void ChunkPool::deallocate_extent(void* p, std::size_t bytes) noexcept {
  {
    const std::lock_guard lock(mutex_);
    stats_.extent_bytes -= bytes;
  }
  deallocate_range(reinterpret_cast<std::uintptr_t>(p), bytes);
}

void* ChunkPool::allocate_buffer(std::size_t requested, std::size_t alignment) {
  const std::size_t bytes = round_up(requested, kPage);
  void* p = allocate_range(bytes, alignment, /*may_dedicate=*/true);
  const std::lock_guard lock(mutex_);
  buffers_.emplace(reinterpret_cast<std::uintptr_t>(p), Buffer{bytes, requested});
  stats_.buffer_bytes += bytes;
  return p;
}

void ChunkPool::deallocate_buffer(void* p, std::size_t requested) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  std::size_t bytes = 0;
  {
    const std::lock_guard lock(mutex_);
    const auto it = buffers_.find(addr);
    if (it == buffers_.end()) {
      throw std::invalid_argument("tide: pinned free: not a live buffer of this arena");
    }
    if (it->second.requested != requested) {
      throw std::invalid_argument("tide: pinned free: the buffer was allocated with " +
                                  std::to_string(it->second.requested) + " bytes, not " +
                                  std::to_string(requested));
    }
    bytes = it->second.bytes;
    buffers_.erase(it);
    stats_.buffer_bytes -= bytes;
  }
  deallocate_range(addr, bytes);
}

bool ChunkPool::same_chunk(const void* a, const void* b) const {
  const std::lock_guard lock(mutex_);
  const auto it = chunk_of_locked(reinterpret_cast<std::uintptr_t>(a));
  return it != chunks_.end() && it == chunk_of_locked(reinterpret_cast<std::uintptr_t>(b));
}

bool ChunkPool::holds_extent_pointer(const void* p) const {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  const std::lock_guard lock(mutex_);
  if (chunk_of_locked(addr) == chunks_.end()) return false;
  // The range starting at or before `addr`, in either map, must not contain it.
  auto inside = [addr](const auto& map, auto size_of) {
    auto it = map.upper_bound(addr);
    if (it == map.begin()) return false;
    --it;
    return addr - it->first < size_of(it->second);
  };
  return !inside(buffers_, [](const Buffer& b) { return b.bytes; }) &&
         !inside(free_, [](std::size_t bytes) { return bytes; });
}

void* ChunkPool::allocate_range(std::size_t bytes, std::size_t alignment, bool may_dedicate) {
  assert(bytes % kPage == 0 && bytes > 0);
  alignment = std::max(alignment, kPage);
  if (alignment > kHugePage || (alignment & (alignment - 1)) != 0) {
    throw std::invalid_argument("tide: pinned arena: alignment must be a power of two <= 2 MiB");
  }
  {
    const std::lock_guard lock(mutex_);
    if (const std::uintptr_t p = take_locked(bytes, alignment)) return reinterpret_cast<void*>(p);
  }
  // One grower at a time: a thread that waited here usually finds the chunk the previous grower
  // made, instead of mapping and registering another.
  const std::lock_guard grow(grow_mutex_);
  std::size_t chunk_bytes = 0;
  bool dedicated = false;
  std::vector<std::pair<std::uintptr_t, std::size_t>> doomed;
  {
    const std::lock_guard lock(mutex_);
    if (const std::uintptr_t p = take_locked(bytes, alignment)) return reinterpret_cast<void*>(p);
    // Kept free chunks are for reuse, not for holding on while the arena grows: none of them
    // could take this request (each is one free range), so they go before a new chunk comes.
    take_free_chunks_locked(doomed);
    const std::size_t regular = next_regular_bytes_locked(bytes);
    // A request that would fill much of a new regular chunk gets an exact one: the rest of a
    // regular chunk stays unused until smaller requests come.
    dedicated = may_dedicate &&
                (bytes >= options_.dedicated_bytes() || bytes > regular / kDedicateFraction);
    chunk_bytes = dedicated ? bytes : regular;
  }
  for (const auto& [base, size] : doomed) release(base, size);
  try {
    reserve_pinned(chunk_bytes);
  } catch (const PinnedLimitError&) {
    // Near the rank's share, a chunk just big enough may still fit where a regular one does not.
    const std::size_t exact = round_up(bytes, kHugePage);
    if (exact >= chunk_bytes) throw;
    reserve_pinned(exact);
    chunk_bytes = exact;
  }
  std::uint64_t touch_ns = 0;
  void* base = nullptr;
  try {
    base = map_chunk(chunk_bytes, placement_, &touch_ns);
  } catch (...) {
    release_pinned(chunk_bytes);
    throw;
  }
  try {
    registrar_.register_chunk(base, chunk_bytes);
  } catch (const driver::CudaError& e) {
    unmap_chunk(base, chunk_bytes);
    release_pinned(chunk_bytes);
    if (e.result() != CUDA_ERROR_OUT_OF_MEMORY) throw;
    // The host would not lock more (RLIMIT_MEMLOCK, memory pressure): an out-of-memory like any
    // other, which callers answer as they answer one (the executor updates on the CPU).
    throw HostMemoryError("tide: pinned memory: the host could not pin " +
                          config::format_bytes(chunk_bytes) + " more (" + e.what() + ")");
  } catch (...) {
    unmap_chunk(base, chunk_bytes);
    release_pinned(chunk_bytes);
    throw;
  }
  const std::lock_guard lock(mutex_);
  const auto addr = reinterpret_cast<std::uintptr_t>(base);
  chunks_.emplace(addr, Chunk{chunk_bytes, 0, dedicated, false});
  if (!dedicated) regular_bytes_ += chunk_bytes;
  stats_.pinned_bytes += chunk_bytes;
  stats_.peak_pinned_bytes = std::max(stats_.peak_pinned_bytes, stats_.pinned_bytes);
  stats_.chunks += 1;
  stats_.chunks_mapped += 1;
  stats_.touch_ns += touch_ns;
  add_free_locked(addr, chunk_bytes);
  const std::uintptr_t p = take_locked(bytes, alignment);
  assert(p != 0);  // the chunk starts at a huge-page boundary and holds `bytes`
  return reinterpret_cast<void*>(p);
}

std::size_t ChunkPool::next_regular_bytes_locked(std::size_t bytes) const {
  std::size_t size = round_up(regular_bytes_ / kRegularGrowthDivisor, kHugePage);
  size = std::clamp(size, kMinRegularChunk, std::max(kMinRegularChunk, options_.chunk_bytes));
  return std::max(size, round_up(bytes, kHugePage));
}

std::uintptr_t ChunkPool::take_locked(std::size_t bytes, std::size_t alignment) {
  int scanned = 0;
  for (auto it = by_size_.lower_bound({bytes, 0});
       it != by_size_.end() && scanned < kMaxAlignedCandidates; ++it, ++scanned) {
    const auto [size, addr] = *it;
    const std::uintptr_t start = round_up(addr, alignment);
    if (start + bytes > addr + size) continue;
    remove_free_locked(addr, size);
    if (start > addr) add_free_locked(addr, start - addr);
    if (start + bytes < addr + size) add_free_locked(start + bytes, addr + size - start - bytes);
    Chunk& chunk = chunk_of_locked(start)->second;
    if (chunk.kept) {
      chunk.kept = false;
      stats_.free_chunk_bytes -= chunk.bytes;
    }
    chunk.used += bytes;
    return start;
  }
  return 0;
}

void ChunkPool::deallocate_range(std::uintptr_t p, std::size_t bytes) noexcept {
  std::uintptr_t doomed_base = 0;
  std::size_t doomed_bytes = 0;
  {
    const std::lock_guard lock(mutex_);
    const auto chunk_it = chunk_of_locked(p);
    assert(chunk_it != chunks_.end());
    if (chunk_it == chunks_.end()) return;
    const std::uintptr_t chunk_base = chunk_it->first;
    Chunk& chunk = chunk_it->second;
    assert(chunk.used >= bytes);
    chunk.used -= bytes;

    // Coalesce with free neighbours of the same chunk only.
    std::uintptr_t lo = p;
    std::uintptr_t hi = p + bytes;
    if (auto next = free_.find(hi); next != free_.end() && hi < chunk_base + chunk.bytes) {
      hi += next->second;
      remove_free_locked(next->first, next->second);
    }
    if (auto prev = free_.lower_bound(lo); prev != free_.begin()) {
      --prev;
      if (prev->first + prev->second == lo && prev->first >= chunk_base) {
        lo = prev->first;
        remove_free_locked(prev->first, prev->second);
      }
    }
    add_free_locked(lo, hi - lo);

    if (chunk.used == 0) {
      if (stats_.free_chunk_bytes + chunk.bytes <= options_.retain_bytes) {
        chunk.kept = true;
        stats_.free_chunk_bytes += chunk.bytes;
      } else {
        remove_free_locked(chunk_base, chunk.bytes);
        doomed_base = chunk_base;
        doomed_bytes = chunk.bytes;
        if (!chunk.dedicated) regular_bytes_ -= chunk.bytes;
        stats_.pinned_bytes -= chunk.bytes;
        stats_.chunks -= 1;
        chunks_.erase(chunk_it);
      }
    }
  }
  // Outside the lock: unregistering takes the driver's lock and unmapping is not free either.
  if (doomed_base != 0) release(doomed_base, doomed_bytes);
}

void ChunkPool::release_free_chunks() {
  std::vector<std::pair<std::uintptr_t, std::size_t>> doomed;
  {
    const std::lock_guard lock(mutex_);
    take_free_chunks_locked(doomed);
  }
  for (const auto& [base, bytes] : doomed) release(base, bytes);
}

void ChunkPool::take_free_chunks_locked(std::vector<std::pair<std::uintptr_t, std::size_t>>& out) {
  for (auto it = chunks_.begin(); it != chunks_.end();) {
    if (it->second.used != 0) {
      ++it;
      continue;
    }
    remove_free_locked(it->first, it->second.bytes);
    out.emplace_back(it->first, it->second.bytes);
    if (!it->second.dedicated) regular_bytes_ -= it->second.bytes;
    stats_.pinned_bytes -= it->second.bytes;
    stats_.chunks -= 1;
    it = chunks_.erase(it);
  }
  stats_.free_chunk_bytes = 0;
}

void ChunkPool::release(std::uintptr_t base, std::size_t bytes) noexcept {
  void* p = reinterpret_cast<void*>(base);
  const bool unregistered = registrar_.unregister_chunk(p);
  unmap_chunk(p, bytes);
  release_pinned(bytes);
  const std::lock_guard lock(mutex_);
  stats_.chunks_released += 1;
  if (!unregistered) stats_.unregister_failures += 1;
}

void ChunkPool::add_free_locked(std::uintptr_t p, std::size_t bytes) {
  free_.emplace(p, bytes);
  by_size_.emplace(bytes, p);
}

void ChunkPool::remove_free_locked(std::uintptr_t p, std::size_t bytes) {
  free_.erase(p);
  by_size_.erase({bytes, p});
}

ChunkPool::ChunkMap::iterator ChunkPool::chunk_of_locked(std::uintptr_t p) {
  auto it = chunks_.upper_bound(p);
  if (it == chunks_.begin()) return chunks_.end();
  --it;
  return p - it->first < it->second.bytes ? it : chunks_.end();
}

ChunkPool::ChunkMap::const_iterator ChunkPool::chunk_of_locked(std::uintptr_t p) const {
  auto it = chunks_.upper_bound(p);
  if (it == chunks_.begin()) return chunks_.end();
  --it;
  return p - it->first < it->second.bytes ? it : chunks_.end();
}

ChunkPoolStats ChunkPool::stats() const {
  const std::lock_guard lock(mutex_);
  return stats_;
}

std::vector<ChunkInfo> ChunkPool::chunks() const {
  const std::lock_guard lock(mutex_);
  std::vector<ChunkInfo> out;
  out.reserve(chunks_.size());
  for (const auto& [base, c] : chunks_) {
    out.push_back(ChunkInfo{reinterpret_cast<void*>(base), c.bytes, c.used, c.dedicated});
  }
  return out;
}

}  // namespace tide::allocator::pinned
