// The caching allocator's front door (allocate, free, record_stream) and its blocks: taking a
// free block for a request, splitting it, and merging a freed one with its free neighbours.
#include "allocator/device/caching_allocator.h"

#include <algorithm>
#include <bit>
#include <cinttypes>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "allocator/device/caching_allocator_parts.h"
#include "driver/cuda_api.h"
#include "driver/error.h"

namespace tide::allocator::device {

CachingAllocator::CachingAllocator(int device, AllocatorConfig config)
    : id_(new_allocator_id()),
      config_(config),
      context_(device),
      thread_cache_enabled_(config.thread_cache_bytes > 0),
      telemetry_(config.telemetry_samples, 1) {
  CUdevice handle = 0;
  TIDE_CU(cuDeviceGet, &handle, device);
  std::size_t total = 0;
  TIDE_CU(cuDeviceTotalMem, &total, handle);
  total_memory_ = total;
  memory_fraction_ = config_.memory_fraction.value_or(1.0);
  limit_ = static_cast<std::uint64_t>(memory_fraction_ * static_cast<double>(total_memory_));
  if (config_.max_bytes) limit_ = std::min(limit_, *config_.max_bytes);
  const std::uint64_t resolution = config_.telemetry_resolution != 0
                                       ? config_.telemetry_resolution
                                       : std::max<std::uint64_t>(total_memory_ / 16384, 64 << 10);
  telemetry_.set_resolution(resolution);
  report_bytes_ = static_cast<std::int64_t>(std::max<std::uint64_t>(resolution, kSmallSize));
  add_live_allocator(id_, this);
}

CachingAllocator::~CachingAllocator() {
  remove_live_allocator(id_);
  const std::lock_guard lock(mutex_);
  try {
    const driver::ContextScope scope(context_);
    // No work may still use the memory when it goes back to the driver.
    pending_.wait_all();
    fences_.wait_all();
    for (const auto& segment : segments_) {
      if (!segment->growable()) free_fixed(segment->base);
    }
    segments_.clear();  // growable ranges unmap and release their pages
    events_.clear();
  } catch (const std::exception&) {
    // The driver failed (device lost): what it holds goes with the process.
  }
}

std::size_t CachingAllocator::round_size(std::size_t bytes) const {
  if (bytes <= kMinBlockSize) return kMinBlockSize;
  std::size_t rounded = align_up(bytes, kMinBlockSize);
  const int divisions = config_.round_divisions;
  if (divisions > 0 && rounded > kSmallSize) {
    const std::size_t power = std::bit_floor(rounded);
    const std::size_t step = std::max(
        kMinBlockSize, align_down(power / static_cast<std::size_t>(divisions), kMinBlockSize));
    rounded = align_up(rounded, step);
  }
  return rounded;
}

void* CachingAllocator::allocate(std::size_t bytes, CUstream stream) {
  if (bytes == 0 || refuse_oversized(bytes, stream)) return nullptr;
  const std::size_t rounded = round_size(bytes);
  if (thread_cache_enabled_ && rounded <= kSmallSize && !tracing()) {
    if (ThreadCache* cache = thread_cache()) {
      if (const CUdeviceptr ptr = cache->take(rounded, stream, bytes)) {
        if (cache->note(static_cast<std::int64_t>(rounded)) > report_bytes_) report(cache);
        return to_void(ptr);
      }
    }
  }
  const bool reclaimable = has_reclaimers_.load(std::memory_order_acquire);
  void* p = allocate_core(bytes, rounded, stream, false, !reclaimable);
  // Reclaimers give back the cheapest first, one kind per call, what the limit lacks (resident
  // state taken back costs a copy home and another to return): the allocation is tried again
  // after each call that freed something (bytes freed need not make room for this block), and
  // once more, for the record, after the first that freed nothing.
  for (int round = 0; p == nullptr && reclaimable; ++round) {
    const bool freed = round < kMaxReclaimRounds && reclaim(shortfall(rounded));
    p = allocate_core(bytes, rounded, stream, false, !freed);
    if (!freed) break;
  }
  return p;
}

void CachingAllocator::deallocate(void* ptr, std::size_t bytes, CUstream stream) {
  if (ptr == nullptr) return;
  if (thread_cache_enabled_ && bytes != 0 && bytes <= kSmallSize && !tracing() &&
      blocks_with_uses_.load(std::memory_order_relaxed) == 0) {
    const std::size_t rounded = round_size(bytes);
    if (rounded <= kSmallSize) {
      if (ThreadCache* cache = thread_cache()) {
        ThreadCache::Entry evicted;
        switch (cache->put({to_device(ptr), rounded, bytes, stream}, &evicted)) {
          case ThreadCache::Put::kCached:
            if (cache->note(-static_cast<std::int64_t>(rounded)) < -report_bytes_) report(cache);
            return;
          case ThreadCache::Put::kCachedEvicted:
            cache->reported();  // the core hears of it now
            deallocate_core(evicted.ptr, evicted.requested, true);
            return;
          case ThreadCache::Put::kRejected:
            break;
          case ThreadCache::Put::kAlreadyCached:
            throw std::invalid_argument("tide allocator: a block freed twice");
        }
      }
    }
  }
  deallocate_core(to_device(ptr), bytes, false);
}

void* CachingAllocator::allocate_from_headroom(std::size_t bytes, CUstream stream) {
  if (bytes == 0 || refuse_oversized(bytes, stream)) return nullptr;
  return allocate_core(bytes, round_size(bytes), stream, true);
}

void CachingAllocator::deallocate_from_headroom(void* ptr, std::size_t bytes, CUstream /*stream*/) {
  if (ptr == nullptr) return;
  // The block keeps the stream it was allocated on; one lock for the check and the free.
  const std::lock_guard lock(mutex_);
  const Block* block = allocated_.find(to_device(ptr));
  if (block != nullptr && !block->from_headroom) {
    throw std::invalid_argument(
        "tide allocator: deallocate_from_headroom of a block from allocate()");
  }
  deallocate_locked(to_device(ptr), bytes, false);
  on_change_locked();
}

void* CachingAllocator::allocate_core(std::size_t bytes, std::size_t rounded, CUstream stream,
                                      bool from_headroom, bool last_try) {
  const std::lock_guard lock(mutex_);
  const PoolKind pool = rounded <= kSmallSize ? PoolKind::kSmall : PoolKind::kLarge;
  Block* block = pools_[pool_index(pool)].best_fit(stream, rounded);
  if (block == nullptr) block = allocate_slow_locked(bytes, rounded, pool, stream, last_try);
  if (block == nullptr) return nullptr;
  take_locked(block, rounded, bytes, stream);
  account_alloc_locked(block, bytes);
  block->from_headroom = from_headroom;
  if (from_headroom) from_headroom_bytes_ += block->size;
  if (recorder_.active()) block->trace_id = recorder_.alloc(now_locked(), bytes, stream);
  on_change_locked();
  return to_void(block->ptr);
}

void CachingAllocator::deallocate_core(CUdeviceptr ptr, std::size_t bytes, bool from_cache) {
  const std::lock_guard lock(mutex_);
  deallocate_locked(ptr, bytes, from_cache);
  on_change_locked();
}

void CachingAllocator::deallocate_locked(CUdeviceptr ptr, std::size_t bytes, bool from_cache) {
  Block* block = allocated_.erase(ptr);
  if (block == nullptr) {
    char text[128];
    std::snprintf(text, sizeof text,
                  "tide allocator: free of 0x%" PRIx64
                  ", which it did not hand out (or freed twice)",
                  static_cast<std::uint64_t>(ptr));
    throw std::invalid_argument(text);
  }
  const std::size_t requested = bytes != 0 ? bytes : block->requested;
  account_free_locked(block, requested, from_cache);
  if (block->from_headroom) {
    from_headroom_bytes_ -= block->size;
    block->from_headroom = false;
  }
  if (recorder_.active() && block->trace_id != 0) recorder_.free(now_locked(), block->trace_id);
  block->trace_id = 0;
  if (!block->uses.empty()) {
    blocks_with_uses_.fetch_sub(1, std::memory_order_relaxed);
    const driver::ContextScope scope(context_);
    pending_.add(block);  // stays active until the other streams' events complete
    return;
  }
  deactivate_locked(block);
}

void CachingAllocator::record_stream(void* ptr, CUstream stream) {
  const std::lock_guard lock(mutex_);
  Block* block = allocated_.find(to_device(ptr));
  if (block == nullptr) {
    throw std::invalid_argument("tide allocator: record_stream of an address it did not hand out");
  }
  if (stream == block->stream) return;
  if (std::find(block->uses.begin(), block->uses.end(), stream) != block->uses.end()) return;
  if (block->uses.empty()) blocks_with_uses_.fetch_add(1, std::memory_order_relaxed);
  block->uses.push_back(stream);
  if (recorder_.active() && block->trace_id != 0) {
    recorder_.record_stream(now_locked(), block->trace_id, stream);
  }
}

bool CachingAllocator::owns(void* ptr) const {
  const std::lock_guard lock(mutex_);
  return allocated_.find(to_device(ptr)) != nullptr;
}

void CachingAllocator::set_memory_fraction(double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    throw std::invalid_argument("tide allocator: the memory fraction must be in (0, 1], not " +
                                std::to_string(fraction));
  }
  const std::lock_guard lock(mutex_);
  memory_fraction_ = fraction;
  limit_ = static_cast<std::uint64_t>(memory_fraction_ * static_cast<double>(total_memory_));
  if (config_.max_bytes) limit_ = std::min(limit_, *config_.max_bytes);
}

std::uint64_t CachingAllocator::limit() const {
  const std::lock_guard lock(mutex_);
  return limit_;
}

// ---- blocks ----

Block* CachingAllocator::split_off_locked(Block* block, std::size_t offset) {
  Block* rest = arena_.make();
  rest->ptr = block->ptr + offset;
  rest->size = block->size - offset;
  rest->stream = block->stream;
  rest->state = block->state;
  rest->pool = block->pool;
  rest->segment = block->segment;
  rest->free_epoch = block->free_epoch;
  rest->prev = block;
  rest->next = block->next;
  if (block->next != nullptr) block->next->prev = rest;
  block->next = rest;
  block->size = offset;
  return rest;
}

void CachingAllocator::unlink_locked(Block* block) {
  if (block->prev != nullptr) {
    block->prev->next = block->next;
  } else {
    block->segment->first = block->next;
  }
  if (block->next != nullptr) block->next->prev = block->prev;
  arena_.recycle(block);
}

Block* CachingAllocator::take_locked(Block* block, std::size_t rounded, std::size_t requested,
                                     CUstream stream) {
  pools_[pool_index(block->pool)].erase(block);
  if (block->size - rounded >= kMinBlockSize) {
    // The rest stays free, with the same tag: its memory has the same pending work.
    pools_[pool_index(block->pool)].insert(split_off_locked(block, rounded));
  }
  block->state = BlockState::kAllocated;
  block->stream = stream;
  block->requested = requested;
  allocated_.insert(block->ptr, block);
  return block;
}

void CachingAllocator::free_block_locked(Block* block) {
  block->state = BlockState::kFree;
  block->uses.clear();
  block->free_epoch = ++free_seq_;
  insert_free_locked(block, block->stream);  // tagged with the stream it was used on
}

Block* CachingAllocator::insert_free_locked(Block* block, CUstream absorb) {
  // Merge with free neighbours of the same tag. A neighbour free on no stream (kAnyStream) may
  // join a block tagged `absorb` (and then carries that tag: a conservative loss of freedom),
  // so that a single-stream program's cache coalesces fully.
  auto mergeable = [&](const Block* n) {
    if (n == nullptr || n->state != BlockState::kFree) return false;
    if (n->stream == block->stream) return true;
    return (block->stream == kAnyStream && n->stream == absorb) ||
           (n->stream == kAnyStream && block->stream == absorb);
  };
  BlockPool& pool = pools_[pool_index(block->pool)];
  for (Block* n : {block->prev, block->next}) {
    if (!mergeable(n)) continue;
    pool.erase(n);
    if (block->stream == kAnyStream) block->stream = n->stream;
    block->free_epoch = std::max(block->free_epoch, n->free_epoch);
    if (n == block->prev) block->ptr = n->ptr;
    block->size += n->size;
    unlink_locked(n);
  }
  pool.insert(block);
  return block;
}

}  // namespace tide::allocator::device
