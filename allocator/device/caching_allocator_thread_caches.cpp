// The caching allocator's per-thread caches of small free blocks (thread_cache.h): which cache
// is this thread's, caches given back when their thread exits, drained when memory runs out, and
// what they hold subtracted from the core's counts.
#include <array>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "allocator/device/caching_allocator.h"
#include "allocator/device/caching_allocator_parts.h"

namespace tide::allocator::device {
namespace {

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

std::uint64_t new_allocator_id() { return next_allocator_id.fetch_add(1); }

void add_live_allocator(std::uint64_t id, CachingAllocator* allocator) {
  LiveAllocators& l = live_allocators();
  const std::lock_guard guard(l.mutex);
  l.live.emplace(id, allocator);
}

void remove_live_allocator(std::uint64_t id) {
  LiveAllocators& l = live_allocators();
  const std::lock_guard guard(l.mutex);
  l.live.erase(id);
}

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

}  // namespace tide::allocator::device
