#include "allocator/caching_allocator.h"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "allocator/phase_detector.h"
#include "driver/cuda_api.h"
#include "driver/error.h"
#include "driver/virtual_memory.h"

namespace tide::allocator {
namespace {

constexpr std::size_t kMaxRequest = std::size_t{1} << 50;  // beyond any device: never rounds over

void* to_void(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }
CUdeviceptr to_device(void* p) {
  return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
}
int pool_index(PoolKind pool) { return pool == PoolKind::kSmall ? 0 : 1; }
int stat_index(PoolKind pool) { return pool == PoolKind::kSmall ? kSmallPool : kLargePool; }
std::size_t align_up(std::size_t n, std::size_t m) { return (n + m - 1) / m * m; }
std::size_t align_down(std::size_t n, std::size_t m) { return n / m * m; }
std::uint64_t saturating_sub(std::uint64_t a, std::uint64_t b) { return a > b ? a - b : 0; }

std::uint64_t steady_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

bool is_out_of_memory(const driver::CudaError& e) { return e.result() == CUDA_ERROR_OUT_OF_MEMORY; }

// Allocators alive in the process, by id: a thread's cache slots name allocators by id, and a
// thread that exits gives its caches back only to allocators still alive.
struct LiveAllocators {
  std::mutex mutex;
  std::unordered_map<std::uint64_t, CachingAllocator*> live;
};
LiveAllocators& live_allocators() {
  static auto* live = new LiveAllocators;  // never destroyed: threads may exit after main
  return *live;
}
std::atomic<std::uint64_t> next_allocator_id{1};

}  // namespace

// This thread's caches, one per allocator it used (a few slots: one allocator per device).
class ThreadCacheSlots {
 public:
  struct Slot {
    std::uint64_t id = 0;
    ThreadCache* cache = nullptr;
  };
  std::array<Slot, 8> slots{};

  ThreadCacheSlots() = default;
  ThreadCacheSlots(const ThreadCacheSlots&) = delete;
  ThreadCacheSlots& operator=(const ThreadCacheSlots&) = delete;
  ~ThreadCacheSlots() {
    // A thread's exit cannot report an error (an exception here would terminate the process):
    // a cache that could not be retired stays in its allocator's list, whose out-of-memory path
    // still drains it (drain_thread_caches_locked); it is just not reused by a new thread.
    try {
      LiveAllocators& l = live_allocators();
      const std::lock_guard guard(l.mutex);
      for (Slot& s : slots) {
        if (s.id == 0) continue;
        const auto it = l.live.find(s.id);
        if (it != l.live.end()) it->second->retire_thread_cache(s.cache);
      }
    } catch (...) {
    }
  }
};

namespace {
thread_local ThreadCacheSlots thread_slots;
}  // namespace

struct CachingAllocator::Corrections {
  std::uint64_t bytes = 0;
  std::uint64_t count = 0;
  std::uint64_t alloc_hits = 0;
  std::uint64_t alloc_hit_bytes = 0;
  std::uint64_t alloc_hit_requested = 0;
  std::uint64_t free_hits = 0;
  std::uint64_t free_hit_bytes = 0;
  std::uint64_t free_hit_requested = 0;
};

std::string OomRecord::describe(int device) const {
  auto mib = [](std::uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
  char text[512];
  std::snprintf(
      text, sizeof text,
      "tide: out of memory on device %d: asked for %.2f MiB (block of %.2f MiB); %.2f MiB "
      "live, %.2f MiB reserved of a limit of %.2f MiB%s; the device has %.2f MiB free of "
      "%.2f MiB; largest free cached block %.2f MiB",
      device, mib(requested), mib(rounded), mib(allocated), mib(reserved), mib(limit),
      limit_reached ? " (the limit refused it: TIDE_ALLOC_MEMORY_FRACTION, "
                      "TIDE_ALLOC_MAX_BYTES or set_memory_fraction)"
                    : "",
      mib(device_free), mib(device_total), mib(largest_free_block));
  return text;
}

CachingAllocator::CachingAllocator(int device, AllocatorConfig config)
    : id_(next_allocator_id.fetch_add(1)),
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
  LiveAllocators& l = live_allocators();
  const std::lock_guard guard(l.mutex);
  l.live.emplace(id_, this);
}

CachingAllocator::~CachingAllocator() {
  {
    LiveAllocators& l = live_allocators();
    const std::lock_guard guard(l.mutex);
    l.live.erase(id_);
  }
  const std::lock_guard lock(mutex_);
  try {
    const ContextScope scope(context_);
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

// ---- allocate / free ----

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

bool CachingAllocator::refuse_oversized(std::size_t bytes, CUstream stream) {
  if (bytes <= kMaxRequest) return false;
  const std::lock_guard lock(mutex_);
  const ContextScope scope(context_);
  record_oom_locked(bytes, bytes, stream, true);
  return true;
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
  return allocate_core(bytes, rounded, stream);
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
                                      bool from_headroom) {
  const std::lock_guard lock(mutex_);
  const PoolKind pool = rounded <= kSmallSize ? PoolKind::kSmall : PoolKind::kLarge;
  Block* block = pools_[pool_index(pool)].best_fit(stream, rounded);
  if (block == nullptr) block = allocate_slow_locked(bytes, rounded, pool, stream);
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
    const ContextScope scope(context_);
    pending_.add(block);  // stays active until the other streams' events complete
    return;
  }
  const int s = stat_index(block->pool);
  for (int i : {static_cast<int>(kAllPools), s}) {
    active_bytes_[i].sub(block->size);
    active_[i].sub(1);
  }
  free_block_locked(block);
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

// ---- thread caches ----

ThreadCache* CachingAllocator::thread_cache() {
  ThreadCacheSlots& slots = thread_slots;
  for (ThreadCacheSlots::Slot& s : slots.slots) {
    if (s.id == id_) return s.cache;
  }
  ThreadCacheSlots::Slot* free_slot = nullptr;
  for (ThreadCacheSlots::Slot& s : slots.slots) {
    if (s.id == 0) {
      free_slot = &s;
      break;
    }
  }
  if (free_slot == nullptr) {
    // Slots of allocators destroyed since can be taken over.
    LiveAllocators& l = live_allocators();
    const std::lock_guard guard(l.mutex);
    for (ThreadCacheSlots::Slot& s : slots.slots) {
      if (l.live.find(s.id) == l.live.end()) {
        s = ThreadCacheSlots::Slot{};
        free_slot = &s;
        break;
      }
    }
    if (free_slot == nullptr) return nullptr;  // this thread uses many allocators: go uncached
  }
  ThreadCache* cache = nullptr;
  {
    const std::lock_guard lock(mutex_);
    if (!idle_caches_.empty()) {
      cache = idle_caches_.back();
      idle_caches_.pop_back();
    } else {
      if (caches_.empty()) {
        // Until now the core's peaks were exact: the corrected ones start from them.
        for (int i = 0; i < 3; ++i) {
          peak_allocated_bytes_[i] = allocated_bytes_[i].peak;
          peak_requested_bytes_[i] = requested_bytes_[i].peak;
          peak_active_bytes_[i] = active_bytes_[i].peak;
          peak_allocation_[i] = allocation_[i].peak;
          peak_active_[i] = active_[i].peak;
        }
      }
      caches_.push_back(std::make_unique<ThreadCache>(config_.thread_cache_bytes));
      cache = caches_.back().get();
    }
  }
  free_slot->id = id_;
  free_slot->cache = cache;
  return cache;
}

void CachingAllocator::report(ThreadCache* cache) {
  cache->reported();
  const std::lock_guard lock(mutex_);
  on_change_locked();
}

void CachingAllocator::retire_thread_cache(ThreadCache* cache) {
  const std::lock_guard lock(mutex_);
  std::vector<ThreadCache::Entry> entries;
  cache->drain(&entries);
  for (const ThreadCache::Entry& e : entries) deallocate_locked(e.ptr, e.requested, true);
  idle_caches_.push_back(cache);
  on_change_locked();
}

void CachingAllocator::drain_thread_caches_locked() {
  std::vector<ThreadCache::Entry> entries;
  for (const auto& cache : caches_) cache->drain(&entries);
  for (const ThreadCache::Entry& e : entries) deallocate_locked(e.ptr, e.requested, true);
}

CachingAllocator::Corrections CachingAllocator::corrections_locked() const {
  Corrections c;
  for (const auto& cache : caches_) {
    c.bytes += cache->bytes();
    c.count += cache->count();
    c.alloc_hits += cache->alloc_hits();
    c.alloc_hit_bytes += cache->alloc_hit_bytes();
    c.alloc_hit_requested += cache->alloc_hit_requested();
    c.free_hits += cache->free_hits();
    c.free_hit_bytes += cache->free_hit_bytes();
    c.free_hit_requested += cache->free_hit_requested();
  }
  return c;
}

// ---- the slow path ----

Block* CachingAllocator::allocate_slow_locked(std::size_t bytes, std::size_t rounded, PoolKind pool,
                                              CUstream stream) {
  const ContextScope scope(context_);
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
  limit_hit = false;
  if (Block* b = grow_locked(rounded, pool, stream, &limit_hit)) return b;
  record_oom_locked(bytes, rounded, stream, limit_hit);
  return nullptr;
}

void CachingAllocator::process_events_locked(CUstream wanted_by) {
  for (Block* b : pending_.poll()) {
    const int s = stat_index(b->pool);
    for (int i : {static_cast<int>(kAllPools), s}) {
      active_bytes_[i].sub(b->size);
      active_[i].sub(1);
    }
    free_block_locked(b);
  }
  for (const StreamFences::Completed& c : fences_.poll()) promote_locked(c.stream, c.covers);
  // Free blocks of other streams could serve `wanted_by` once their streams' work is done:
  // fence those streams now, and take what is already done.
  bool recorded = false;
  for (BlockPool& pool : pools_) {
    for (CUstream tag : pool.tags()) {
      if (tag == kAnyStream || tag == wanted_by || fences_.in_flight(tag)) continue;
      if (fences_.record(tag, free_seq_)) {
        recorded = true;
      } else {
        TIDE_CU(cuCtxSynchronize);  // the stream is gone: wait for everything instead
        promote_locked(tag, std::numeric_limits<std::uint64_t>::max());
      }
    }
  }
  if (recorded) {
    for (const StreamFences::Completed& c : fences_.poll()) promote_locked(c.stream, c.covers);
  }
}

void CachingAllocator::synchronize_all_locked() {
  ++num_sync_all_streams_;
  for (Block* b : pending_.wait_all()) {
    const int s = stat_index(b->pool);
    for (int i : {static_cast<int>(kAllPools), s}) {
      active_bytes_[i].sub(b->size);
      active_[i].sub(1);
    }
    free_block_locked(b);
  }
  // Two rounds: a fence already in flight may cover fewer frees than a new one would.
  for (int round = 0; round < 2; ++round) {
    for (const StreamFences::Completed& c : fences_.wait_all()) promote_locked(c.stream, c.covers);
    bool any = false;
    for (BlockPool& pool : pools_) {
      for (CUstream tag : pool.tags()) {
        if (tag == kAnyStream) continue;
        any = true;
        if (!fences_.record(tag, free_seq_)) {
          TIDE_CU(cuCtxSynchronize);
          promote_locked(tag, std::numeric_limits<std::uint64_t>::max());
        }
      }
    }
    if (!any) break;
  }
  for (const StreamFences::Completed& c : fences_.wait_all()) promote_locked(c.stream, c.covers);
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

// ---- growing and releasing ----

Block* CachingAllocator::grow_locked(std::size_t rounded, PoolKind pool, CUstream stream,
                                     bool* limit_hit) {
  if (pool == PoolKind::kLarge && config_.growable) {
    ensure_growable_locked();
    if (growable_ != nullptr) {
      bool no_room = false;
      Block* b = grow_growable_locked(rounded, stream, limit_hit, &no_room);
      if (b != nullptr || !no_room) return b;
      // No address range left that fits: a fixed segment instead.
    }
  }
  return new_fixed_segment_locked(rounded, pool, limit_hit);
}

void CachingAllocator::ensure_growable_locked() {
  if (growable_ != nullptr || growable_failed_) return;
  if (!driver::has_virtual_memory()) {
    growable_failed_ = true;
    return;
  }
  try {
    auto segment = std::make_unique<Segment>();
    // Twice the device's memory: blocks never move, so room to place a block contiguously must
    // survive live blocks scattered over the range.
    segment->vm = std::make_unique<GrowableRange>(2 * total_memory_, device());
    segment->base = segment->vm->base();
    segment->size = segment->vm->size();
    segment->pool = PoolKind::kLarge;
    Block* hole = arena_.make();
    hole->ptr = segment->base;
    hole->size = segment->size;
    hole->state = BlockState::kUnmapped;
    hole->pool = PoolKind::kLarge;
    hole->segment = segment.get();
    segment->first = hole;
    growable_ = segment.get();
    segments_.push_back(std::move(segment));
    for (int i : {static_cast<int>(kAllPools), static_cast<int>(kLargePool)}) segment_[i].add(1);
  } catch (const driver::CudaError&) {
    growable_failed_ = true;  // e.g. CUDA_ERROR_NOT_SUPPORTED: fixed segments only
  }
}

Block* CachingAllocator::grow_growable_locked(std::size_t rounded, CUstream stream, bool* limit_hit,
                                              bool* no_room) {
  GrowableRange& vm = *growable_->vm;
  const std::size_t page = vm.page_size();
  auto usable = [&](const Block* n) {
    return n != nullptr && n->state == BlockState::kFree &&
           (n->stream == stream || n->stream == kAnyStream);
  };
  // Back as few pages as possible: the start of a hole next to a usable free block before it,
  // the end of a hole next to one after it, or a whole hole between two.
  Block* best_hole = nullptr;
  std::size_t best_offset = 0;
  std::size_t best_bytes = 0;
  auto consider = [&](Block* hole, std::size_t offset, std::size_t bytes) {
    if (bytes == 0 || bytes > hole->size) return;
    if (best_hole == nullptr || bytes < best_bytes) {
      best_hole = hole;
      best_offset = offset;
      best_bytes = bytes;
    }
  };
  for (Block* h = growable_->first; h != nullptr; h = h->next) {
    if (h->state != BlockState::kUnmapped) continue;
    const std::size_t start = h->ptr - growable_->base;
    const std::size_t before = usable(h->prev) ? h->prev->size : 0;
    const std::size_t after = usable(h->next) ? h->next->size : 0;
    consider(h, start, align_up(rounded - std::min(before, rounded - 1), page));
    if (after > 0) {
      const std::size_t bytes = align_up(rounded - std::min(after, rounded - 1), page);
      if (bytes <= h->size) consider(h, start + h->size - bytes, bytes);
    }
    if (before + h->size + after >= rounded) consider(h, start, h->size);
  }
  if (best_hole == nullptr) {
    *no_room = true;
    return nullptr;
  }
  if (reserved_locked() + best_bytes > limit_) {
    *limit_hit = true;
    return nullptr;
  }
  std::size_t pages = 0;
  try {
    pages = vm.map(best_offset, best_bytes);
  } catch (const driver::CudaError& e) {
    if (is_out_of_memory(e)) return nullptr;
    throw;
  }
  num_device_alloc_ += pages;
  for (int i : {static_cast<int>(kAllPools), static_cast<int>(kLargePool)}) {
    reserved_bytes_[i].add(best_bytes);
  }
  // Cut the backed range out of the hole.
  Block* fresh = best_hole;
  const CUdeviceptr at = growable_->base + best_offset;
  if (fresh->ptr < at) fresh = split_off_locked(fresh, at - fresh->ptr);
  if (fresh->size > best_bytes) split_off_locked(fresh, best_bytes);  // the rest stays a hole
  fresh->state = BlockState::kFree;
  fresh->stream = kAnyStream;
  fresh->free_epoch = 0;
  insert_free_locked(fresh, stream);
  return pools_[pool_index(PoolKind::kLarge)].best_fit(stream, rounded);
}

Block* CachingAllocator::new_fixed_segment_locked(std::size_t rounded, PoolKind pool,
                                                  bool* limit_hit) {
  const std::size_t size = fixed_segment_size(rounded, pool);
  if (reserved_locked() + size > limit_) {
    *limit_hit = true;
    return nullptr;
  }
  CUdeviceptr base = 0;
  try {
    base = allocate_fixed(size);
  } catch (const driver::CudaError& e) {
    if (is_out_of_memory(e)) return nullptr;
    throw;
  }
  ++num_device_alloc_;
  for (int i : {static_cast<int>(kAllPools), stat_index(pool)}) {
    reserved_bytes_[i].add(size);
    segment_[i].add(1);
  }
  auto segment = std::make_unique<Segment>();
  segment->base = base;
  segment->size = size;
  segment->pool = pool;
  Block* block = arena_.make();
  block->ptr = base;
  block->size = size;
  block->state = BlockState::kFree;
  block->stream = kAnyStream;
  block->pool = pool;
  block->segment = segment.get();
  segment->first = block;
  segments_.push_back(std::move(segment));
  pools_[pool_index(pool)].insert(block);
  return block;
}

void CachingAllocator::release_cached_locked() {
  // Fixed segments that are wholly free and free on every stream go back whole.
  for (auto it = segments_.begin(); it != segments_.end();) {
    Segment* s = it->get();
    Block* b = s->first;
    if (s->growable() || b->next != nullptr || b->state != BlockState::kFree ||
        b->stream != kAnyStream) {
      ++it;
      continue;
    }
    pools_[pool_index(s->pool)].erase(b);
    free_fixed(s->base);
    ++num_device_free_;
    for (int i : {static_cast<int>(kAllPools), stat_index(s->pool)}) {
      reserved_bytes_[i].sub(s->size);
      segment_[i].sub(1);
    }
    arena_.recycle(b);
    it = segments_.erase(it);
  }
  if (growable_ == nullptr) return;
  // The growable segment gives back every whole page inside a free block.
  GrowableRange& vm = *growable_->vm;
  const std::size_t page = vm.page_size();
  const CUdeviceptr base = growable_->base;
  for (Block* b = growable_->first; b != nullptr;) {
    Block* next = b->next;
    if (b->state == BlockState::kFree && b->stream == kAnyStream) {
      const std::size_t lo = align_up(b->ptr - base, page);
      const std::size_t hi = align_down(b->ptr + b->size - base, page);
      if (hi > lo) {
        BlockPool& pool = pools_[pool_index(PoolKind::kLarge)];
        pool.erase(b);
        num_device_free_ += vm.unmap(lo, hi - lo);
        for (int i : {static_cast<int>(kAllPools), static_cast<int>(kLargePool)}) {
          reserved_bytes_[i].sub(hi - lo);
        }
        Block* hole = b;
        if (base + lo > b->ptr) {
          hole = split_off_locked(b, base + lo - b->ptr);
          pool.insert(b);  // the free part below the first whole page
        }
        if (hole->size > hi - lo) pool.insert(split_off_locked(hole, hi - lo));
        hole->state = BlockState::kUnmapped;
        hole->stream = nullptr;
        // One hole per unbacked range: merge with unbacked neighbours.
        for (Block* n : {hole->prev, hole->next}) {
          if (n == nullptr || n->state != BlockState::kUnmapped) continue;
          if (n == hole->prev) hole->ptr = n->ptr;
          hole->size += n->size;
          unlink_locked(n);
        }
        next = hole->next;  // the old next may have merged into the hole
      }
    }
    b = next;
  }
}

void CachingAllocator::empty_cache() {
  const std::lock_guard lock(mutex_);
  const ContextScope scope(context_);
  drain_thread_caches_locked();
  synchronize_all_locked();
  release_cached_locked();
  if (recorder_.active()) recorder_.empty_cache(now_locked());
  on_change_locked();
}

void CachingAllocator::record_oom_locked(std::size_t bytes, std::size_t rounded, CUstream stream,
                                         bool limit_hit) {
  OomRecord r;
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
  telemetry_.sample(Sample{r.t_ns, r.allocated, r.reserved});
}

// ---- accounting ----

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
  for (const BlockPool& pool : pools_) {
    s.largest_free_block = std::max<std::uint64_t>(s.largest_free_block, pool.largest());
  }
  s.growable = growable_ != nullptr ? 1 : 0;
  return s;
}

CachingAllocator::Usage CachingAllocator::usage() const {
  const std::lock_guard lock(mutex_);
  return Usage{live_locked(), reserved_locked()};
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

std::vector<OomRecord> CachingAllocator::ooms() const {
  const std::lock_guard lock(mutex_);
  return ooms_.snapshot();
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

// ---- telemetry ----

void CachingAllocator::mark(Mark mark) {
  const std::lock_guard lock(mutex_);
  const std::uint64_t t = now_locked();
  telemetry_.mark(mark, t, live_locked(), reserved_locked(), from_headroom_bytes_);
  if (recorder_.active()) recorder_.mark(t, mark);
}

std::vector<Sample> CachingAllocator::timeline() const {
  const std::lock_guard lock(mutex_);
  return telemetry_.samples();
}

std::vector<MarkEvent> CachingAllocator::marks() const {
  const std::lock_guard lock(mutex_);
  return telemetry_.marks();
}

std::vector<IterationStats> CachingAllocator::iterations() const {
  std::vector<Sample> samples;
  std::vector<IterationStats> marked;
  {
    const std::lock_guard lock(mutex_);
    samples = telemetry_.samples();
    marked = telemetry_.marked_iterations();
  }
  if (marked.empty()) return detect_iterations(samples);
  for (IterationStats& it : marked) {
    if (!it.any_phase()) {
      const std::uint64_t index = it.index;
      it = summarize_iteration(samples, it.start_ns, it.end_ns, nullptr);
      it.index = index;
    }
  }
  return marked;
}

HeadroomForecast CachingAllocator::headroom() const {
  std::uint64_t limit = 0;
  std::uint64_t reserved = 0;
  std::uint64_t peak = 0;
  {
    const std::lock_guard lock(mutex_);
    limit = limit_;
    reserved = reserved_locked();
    peak = std::max(peak_allocated_bytes_[kAllPools], live_locked());
  }
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  {
    const ContextScope scope(context_);
    TIDE_CU(cuMemGetInfo, &free_bytes, &total_bytes);
  }
  // What this process may hold: its limit, and no more than it holds plus what the device has
  // free (other processes may use the rest).
  const std::uint64_t effective = std::min<std::uint64_t>(limit, reserved + free_bytes);
  const std::vector<IterationStats> its = iterations();
  return forecast_headroom(its, effective, config_.headroom_margin, config_.headroom_iterations,
                           peak);
}

void CachingAllocator::set_clock(std::function<std::uint64_t()> clock) {
  const std::lock_guard lock(mutex_);
  clock_ = std::move(clock);
}

std::uint64_t CachingAllocator::telemetry_resolution() const {
  const std::lock_guard lock(mutex_);
  return telemetry_.resolution();
}

// ---- allocation-event trace ----

void CachingAllocator::start_trace(std::size_t max_events) {
  tracing_.store(true, std::memory_order_relaxed);  // new frees and allocations skip the caches
  const std::lock_guard lock(mutex_);
  drain_thread_caches_locked();
  const std::uint64_t t = now_locked();
  recorder_.start(t, max_events, device(), limit_);
  // What is live now, as allocations at time 0, oldest address first.
  std::vector<Block*> live;
  allocated_.for_each([&](CUdeviceptr, Block* b) { live.push_back(b); });
  std::sort(live.begin(), live.end(),
            [](const Block* a, const Block* b) { return a->ptr < b->ptr; });
  for (Block* b : live) b->trace_id = recorder_.alloc(t, b->requested, b->stream);
  on_change_locked();
}

Trace CachingAllocator::stop_trace() {
  const std::lock_guard lock(mutex_);
  tracing_.store(false, std::memory_order_relaxed);
  allocated_.for_each([](CUdeviceptr, Block* b) { b->trace_id = 0; });
  return recorder_.stop();
}

}  // namespace tide::allocator
