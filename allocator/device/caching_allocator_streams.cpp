// The caching allocator's stream order: a block freed on a stream is reused on another only
// after an event on the first shows the work submitted before the free to be done
// (stream_events.h). Free blocks carry the stream they were used on; completed events promote
// them to kAnyStream.
#include <limits>

#include "allocator/device/caching_allocator.h"
#include "allocator/device/caching_allocator_parts.h"
#include "driver/cuda_api.h"
#include "driver/error.h"

namespace tide::allocator::device {

void CachingAllocator::process_events_locked(CUstream wanted_by) {
  for (Block* b : pending_.poll()) deactivate_locked(b);
  for (const StreamFences::Completed& c : fences_.poll()) promote_locked(c.stream, c.covers);
  // Free blocks of other streams could serve `wanted_by` once their streams' work is done:
  // fence those streams now, and take what is already done.
  bool recorded = false;
  for (BlockPool& pool : pools_) {
    for (CUstream tag : pool.tags()) {
      if (tag == kAnyStream || tag == wanted_by || fences_.in_flight(tag)) continue;
      recorded = fence_locked(tag) || recorded;
    }
  }
  if (recorded) {
    for (const StreamFences::Completed& c : fences_.poll()) promote_locked(c.stream, c.covers);
  }
}

void CachingAllocator::synchronize_all_locked() {
  ++num_sync_all_streams_;
  for (Block* b : pending_.wait_all()) deactivate_locked(b);
  // Two rounds: a fence already in flight may cover fewer frees than a new one would.
  for (int round = 0; round < 2; ++round) {
    for (const StreamFences::Completed& c : fences_.wait_all()) promote_locked(c.stream, c.covers);
    bool any = false;
    for (BlockPool& pool : pools_) {
      for (CUstream tag : pool.tags()) {
        if (tag == kAnyStream) continue;
        any = true;
        fence_locked(tag);
      }
    }
    if (!any) break;
  }
  for (const StreamFences::Completed& c : fences_.wait_all()) promote_locked(c.stream, c.covers);
}

bool CachingAllocator::fence_locked(CUstream stream) {
  if (fences_.record(stream, free_seq_)) return true;
  TIDE_CU(cuCtxSynchronize);  // the stream is gone: wait for everything instead
  promote_locked(stream, std::numeric_limits<std::uint64_t>::max());
  return false;
}

std::uint64_t CachingAllocator::frees_so_far() const {
  const std::lock_guard lock(mutex_);
  return free_seq_;
}

void CachingAllocator::streams_waited(CUstream stream, std::uint64_t frees) {
  const std::lock_guard lock(mutex_);
  if (stream == kAnyStream) return;
  promote_locked(stream, frees);
}

void CachingAllocator::promote_locked(CUstream stream, std::uint64_t covers) {
  for (BlockPool& pool : pools_) {
    for (Block* b : pool.tagged(stream)) {
      if (b->free_epoch > covers) continue;
      pool.erase(b);
      b->stream = kAnyStream;
      insert_free_locked(b, kAnyStream);
    }
  }
}

}  // namespace tide::allocator::device
