// Reclaimers: memory given back by its holders before an allocation fails (caching_allocator.h).
#include <utility>

#include "allocator/device/caching_allocator.h"

namespace tide::allocator::device {

std::uint64_t CachingAllocator::add_reclaimer(Reclaimer reclaimer) {
  const std::lock_guard lock(reclaim_mutex_);
  const std::uint64_t id = next_reclaimer_++;
  reclaimers_.emplace_back(id, std::move(reclaimer));
  has_reclaimers_.store(true, std::memory_order_release);
  return id;
}

void CachingAllocator::remove_reclaimer(std::uint64_t id) {
  const std::lock_guard lock(reclaim_mutex_);  // waits for a reclaim() in progress
  std::erase_if(reclaimers_, [id](const auto& r) { return r.first == id; });
  has_reclaimers_.store(!reclaimers_.empty(), std::memory_order_release);
}

bool CachingAllocator::reclaim(std::size_t bytes) {
  // One reclaim at a time: two threads short of memory at once ask once each, in turn.
  const std::lock_guard lock(reclaim_mutex_);
  std::uint64_t freed = 0;
  for (auto& [id, reclaimer] : reclaimers_) {
    if (freed >= bytes) break;
    try {
      freed += reclaimer(bytes - freed);
    } catch (...) {
      // A holder that cannot give memory back leaves the allocation to fail as it would have.
    }
  }
  return freed > 0;
}

}  // namespace tide::allocator::device
