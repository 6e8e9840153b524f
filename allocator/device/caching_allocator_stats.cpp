// The caching allocator's statistics (stats.h): the core's counts as blocks are handed out and
// taken back, the peaks of what is really live while threads' caches hold blocks, the telemetry
// told of every change, and resets.
#include <algorithm>
#include <chrono>

#include "allocator/device/caching_allocator.h"
#include "allocator/device/caching_allocator_parts.h"

namespace tide::allocator::device {
namespace {

std::uint64_t steady_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

}  // namespace

void CachingAllocator::account_alloc_locked(const Block* block, std::size_t requested) {
  for (int i : {static_cast<int>(kAllPools), stat_index(block->pool)}) {
    allocated_bytes_[i].add(block->size);
    requested_bytes_[i].add(requested);
    allocation_[i].add(1);
    active_bytes_[i].add(block->size);
    active_[i].add(1);
  }
}

void CachingAllocator::account_free_locked(const Block* block, std::size_t requested,
                                           bool from_cache) {
  for (int i : {static_cast<int>(kAllPools), stat_index(block->pool)}) {
    // A block coming back from a thread's cache was counted as freed (and its requested bytes
    // as gone) when the thread cached it.
    allocated_bytes_[i].current -= block->size;
    allocation_[i].current -= 1;
    if (!from_cache) {
      allocated_bytes_[i].freed += block->size;
      allocation_[i].freed += 1;
      requested_bytes_[i].sub(requested);
    }
  }
}

void CachingAllocator::on_change_locked() {
  std::uint64_t cached_bytes = 0;
  if (!caches_.empty()) {
    // The core counts blocks sitting in threads' caches as allocated: the peaks of what is
    // really live are tracked here (the caches hold small blocks only: the large pool's own
    // peaks are right).
    const Corrections c = corrections_locked();
    cached_bytes = c.bytes;
    for (int i : {static_cast<int>(kAllPools), static_cast<int>(kSmallPool)}) {
      peak_allocated_bytes_[i] =
          std::max(peak_allocated_bytes_[i], saturating_sub(allocated_bytes_[i].current, c.bytes));
      peak_requested_bytes_[i] =
          std::max(peak_requested_bytes_[i],
                   saturating_sub(requested_bytes_[i].current + c.alloc_hit_requested,
                                  c.free_hit_requested));
      peak_allocation_[i] =
          std::max(peak_allocation_[i], saturating_sub(allocation_[i].current, c.count));
      peak_active_bytes_[i] =
          std::max(peak_active_bytes_[i], saturating_sub(active_bytes_[i].current, c.bytes));
      peak_active_[i] = std::max(peak_active_[i], saturating_sub(active_[i].current, c.count));
    }
  }
  const std::uint64_t live = saturating_sub(allocated_bytes_[kAllPools].current, cached_bytes);
  telemetry_.on_change(
      live, reserved_locked(), [this] { return now_locked(); }, from_headroom_bytes_);
}

std::uint64_t CachingAllocator::live_locked() const {
  return saturating_sub(allocated_bytes_[kAllPools].current, corrections_locked().bytes);
}

std::uint64_t CachingAllocator::now_locked() const { return clock_ ? clock_() : steady_ns(); }

AllocatorStats CachingAllocator::stats() const {
  const std::lock_guard lock(mutex_);
  const Corrections c = corrections_locked();
  AllocatorStats s;
  s.allocated_bytes = allocated_bytes_;
  s.requested_bytes = requested_bytes_;
  s.reserved_bytes = reserved_bytes_;
  s.active_bytes = active_bytes_;
  s.allocation = allocation_;
  s.active = active_;
  s.segment = segment_;
  for (int i : {static_cast<int>(kAllPools), static_cast<int>(kSmallPool)}) {
    s.allocated_bytes[i].current = saturating_sub(s.allocated_bytes[i].current, c.bytes);
    s.allocated_bytes[i].allocated += c.alloc_hit_bytes;
    s.allocated_bytes[i].freed += c.free_hit_bytes;
    s.active_bytes[i].current = saturating_sub(s.active_bytes[i].current, c.bytes);
    s.active_bytes[i].allocated += c.alloc_hit_bytes;
    s.active_bytes[i].freed += c.free_hit_bytes;
    s.allocation[i].current = saturating_sub(s.allocation[i].current, c.count);
    s.allocation[i].allocated += c.alloc_hits;
    s.allocation[i].freed += c.free_hits;
    s.active[i].current = saturating_sub(s.active[i].current, c.count);
    s.active[i].allocated += c.alloc_hits;
    s.active[i].freed += c.free_hits;
    s.requested_bytes[i].current =
        saturating_sub(s.requested_bytes[i].current + c.alloc_hit_requested, c.free_hit_requested);
    s.requested_bytes[i].allocated += c.alloc_hit_requested - requested_hits_base_[0];
    s.requested_bytes[i].freed += c.free_hit_requested - requested_hits_base_[1];
  }
  if (!caches_.empty()) {
    // The core's own peaks count cached blocks as allocated; the corrected ones do not.
    for (int i : {static_cast<int>(kAllPools), static_cast<int>(kSmallPool)}) {
      s.allocated_bytes[i].peak = std::max(peak_allocated_bytes_[i], s.allocated_bytes[i].current);
      s.requested_bytes[i].peak = std::max(peak_requested_bytes_[i], s.requested_bytes[i].current);
      s.active_bytes[i].peak = std::max(peak_active_bytes_[i], s.active_bytes[i].current);
      s.allocation[i].peak = std::max(peak_allocation_[i], s.allocation[i].current);
      s.active[i].peak = std::max(peak_active_[i], s.active[i].current);
    }
  }
  // Free blocks in segments that are partly in use.
  for (const auto& segment : segments_) {
    bool in_use = false;
    for (const Block* b = segment->first; b != nullptr; b = b->next) {
      in_use = in_use || b->state == BlockState::kAllocated || b->state == BlockState::kPending;
    }
    if (!in_use) continue;
    for (const Block* b = segment->first; b != nullptr; b = b->next) {
      if (b->state != BlockState::kFree) continue;
      for (int i : {static_cast<int>(kAllPools), stat_index(segment->pool)}) {
        s.inactive_split_bytes[i] += b->size;
        s.inactive_split[i] += 1;
      }
    }
  }
  s.num_alloc_retries = num_alloc_retries_;
  s.num_ooms = num_ooms_;
  s.num_sync_all_streams = num_sync_all_streams_;
  s.num_device_alloc = num_device_alloc_;
  s.num_device_free = num_device_free_;
  s.memory_limit = limit_;
  s.thread_cached_bytes = c.bytes;
  s.thread_cache_hits = c.alloc_hits;
  for (const BlockPool& pool : pools_) {
    s.largest_free_block = std::max<std::uint64_t>(s.largest_free_block, pool.largest());
  }
  s.growable = growable_ != nullptr ? 1 : 0;
  return s;
}

CachingAllocator::Usage CachingAllocator::usage() const {
  const std::lock_guard lock(mutex_);
  return Usage{live_locked(), reserved_locked(), cache_releases_};
}

void CachingAllocator::reset_peak_stats() {
  const std::lock_guard lock(mutex_);
  for (StatArray* a : {&allocated_bytes_, &requested_bytes_, &reserved_bytes_, &active_bytes_,
                       &allocation_, &active_, &segment_}) {
    for (Stat& s : *a) s.reset_peak();
  }
  for (int i = 0; i < 3; ++i) {
    peak_allocated_bytes_[i] = 0;
    peak_requested_bytes_[i] = 0;
    peak_active_bytes_[i] = 0;
    peak_allocation_[i] = 0;
    peak_active_[i] = 0;
  }
  on_change_locked();  // the corrected peaks restart from the current values
}

void CachingAllocator::reset_accumulated_stats() {
  const std::lock_guard lock(mutex_);
  for (StatArray* a : {&allocated_bytes_, &requested_bytes_, &reserved_bytes_, &active_bytes_,
                       &allocation_, &active_, &segment_}) {
    for (Stat& s : *a) s.reset_accumulated();
  }
  const Corrections c = corrections_locked();
  requested_hits_base_[0] = c.alloc_hit_requested;
  requested_hits_base_[1] = c.free_hit_requested;
  for (const auto& cache : caches_) cache->reset_accumulated();
  num_alloc_retries_ = 0;
  num_ooms_ = 0;
  num_sync_all_streams_ = 0;
  num_device_alloc_ = 0;
  num_device_free_ = 0;
}

}  // namespace tide::allocator::device
