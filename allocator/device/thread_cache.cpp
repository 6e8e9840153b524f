#include "allocator/device/thread_cache.h"

namespace tide::allocator::device {

CUdeviceptr ThreadCache::take(std::size_t size, CUstream stream, std::size_t requested) {
  lock();
  Bin& bin = bins_[bin_of(size)];
  // Newest first: the most recently freed block is the likeliest to be warm.
  for (std::size_t i = bin.used; i-- > 0;) {
    Entry& e = bin.entries[i];
    if (e.size != size || e.stream != stream) continue;
    const CUdeviceptr ptr = e.ptr;
    for (std::size_t j = i; j + 1 < bin.used; ++j) bin.entries[j] = bin.entries[j + 1];
    --bin.used;
    drop(bytes_, size);
    drop(count_, 1);
    bump(alloc_hit_requested_, requested);
    bump(alloc_hits_, 1);
    bump(alloc_hit_bytes_, size);
    unlock();
    return ptr;
  }
  unlock();
  return 0;
}

ThreadCache::Put ThreadCache::put(const Entry& entry, Entry* evicted) {
  lock();
  if (bytes_.load(std::memory_order_relaxed) + entry.size > capacity_) {
    unlock();
    return Put::kRejected;
  }
  Bin& bin = bins_[bin_of(entry.size)];
  for (std::size_t i = 0; i < bin.used; ++i) {
    if (bin.entries[i].ptr == entry.ptr) {
      unlock();
      return Put::kAlreadyCached;
    }
  }
  Put result = Put::kCached;
  if (bin.used == kSlots) {
    // The bin is full: its oldest block goes back to the core.
    *evicted = bin.entries[0];
    for (std::size_t j = 0; j + 1 < kSlots; ++j) bin.entries[j] = bin.entries[j + 1];
    --bin.used;
    drop(bytes_, evicted->size);
    drop(count_, 1);
    result = Put::kCachedEvicted;
  }
  bin.entries[bin.used++] = entry;
  bump(bytes_, entry.size);
  bump(count_, 1);
  bump(free_hit_requested_, entry.requested);
  bump(free_hits_, 1);
  bump(free_hit_bytes_, entry.size);
  unlock();
  return result;
}

void ThreadCache::drain(std::vector<Entry>* out) {
  lock();
  for (Bin& bin : bins_) {
    for (std::size_t i = 0; i < bin.used; ++i) out->push_back(bin.entries[i]);
    bin.used = 0;
  }
  bytes_.store(0, std::memory_order_relaxed);
  count_.store(0, std::memory_order_relaxed);
  unlock();
}

void ThreadCache::reset_accumulated() {
  lock();
  alloc_hits_.store(0, std::memory_order_relaxed);
  alloc_hit_bytes_.store(0, std::memory_order_relaxed);
  free_hits_.store(0, std::memory_order_relaxed);
  free_hit_bytes_.store(0, std::memory_order_relaxed);
  unlock();
}

}  // namespace tide::allocator::device
