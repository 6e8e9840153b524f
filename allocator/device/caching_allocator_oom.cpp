// The caching allocator's slow path, for a request no cached free block serves: blocks whose
// streams' events have completed, then more memory from the driver; and when that fails, out of
// memory: what waits for events or sits in threads' caches is freed, the cache goes back to the
// driver, one more try, and otherwise an OomRecord of the state and a null pointer.
#include <algorithm>

#include "allocator/device/caching_allocator.h"
#include "allocator/device/caching_allocator_parts.h"
#include "driver/cuda_api.h"

namespace tide::allocator::device {
namespace {

constexpr std::size_t kMaxRequest = std::size_t{1} << 50;  // beyond any device: never rounds over

}  // namespace

bool CachingAllocator::refuse_oversized(std::size_t bytes, CUstream stream) {
  if (bytes <= kMaxRequest) return false;
  const std::lock_guard lock(mutex_);
  const driver::ContextScope scope(context_);
  record_oom_locked(bytes, bytes, stream, true);
  return true;
}

Block* CachingAllocator::allocate_slow_locked(std::size_t bytes, std::size_t rounded, PoolKind pool,
                                              CUstream stream, bool last_try) {
  const driver::ContextScope scope(context_);
  BlockPool& free_blocks = pools_[pool_index(pool)];
  process_events_locked(stream);
  if (Block* b = free_blocks.best_fit(stream, rounded)) return b;
  bool limit_hit = false;
  if (Block* b = grow_locked(rounded, pool, stream, &limit_hit)) return b;
  // Out of memory. First what waits for events or sits in threads' caches...
  drain_thread_caches_locked();
  synchronize_all_locked();
  if (Block* b = free_blocks.best_fit(stream, rounded)) return b;
  // ...then give the cache back to the driver and try once more.
  release_cached_locked();
  ++num_alloc_retries_;
  ++cache_releases_;
  limit_hit = false;
  if (Block* b = grow_locked(rounded, pool, stream, &limit_hit)) return b;
  if (last_try) record_oom_locked(bytes, rounded, stream, limit_hit);
  return nullptr;
}

void CachingAllocator::record_oom_locked(std::size_t bytes, std::size_t rounded, CUstream stream,
                                         bool limit_hit) {
  telemetry::OomRecord r;
  r.t_ns = now_locked();
  r.requested = bytes;
  r.rounded = rounded;
  r.stream = stream;
  r.allocated = live_locked();
  r.reserved = reserved_locked();
  r.limit = limit_;
  // The limit refused it only if it is below the device's memory (else the device did).
  r.limit_reached = limit_hit && limit_ < total_memory_;
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  if (driver::cuda().cuMemGetInfo(&free_bytes, &total_bytes) == CUDA_SUCCESS) {
    r.device_free = free_bytes;
    r.device_total = total_bytes;
  }
  for (const BlockPool& pool : pools_) {
    r.largest_free_block = std::max<std::uint64_t>(r.largest_free_block, pool.largest());
  }
  ooms_.push(r);
  ++num_ooms_;
  telemetry_.sample(telemetry::Sample{r.t_ns, r.allocated, r.reserved});
}

std::vector<telemetry::OomRecord> CachingAllocator::ooms() const {
  const std::lock_guard lock(mutex_);
  return ooms_.snapshot();
}

}  // namespace tide::allocator::device
