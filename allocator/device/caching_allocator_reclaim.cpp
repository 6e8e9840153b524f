// Reclaimers: memory given back by its holders before an allocation fails (caching_allocator.h).
#include <utility>

#include "allocator/device/caching_allocator.h"
#include "allocator/device/caching_allocator_parts.h"
#include "allocator/device/segment.h"

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

std::size_t CachingAllocator::shortfall(std::size_t rounded) {
  const std::lock_guard lock(mutex_);
  // The growable segment maps whole pages (grow_growable_locked); otherwise a fixed segment as
  // large as fixed_segment_size makes it, as for small blocks always.
  const PoolKind pool = rounded <= kSmallSize ? PoolKind::kSmall : PoolKind::kLarge;
  std::size_t need = fixed_segment_size(rounded, pool);
  if (pool == PoolKind::kLarge && growable_ != nullptr) {
    need = align_up(rounded, growable_->vm->page_size());
  }
  const std::size_t reserved = reserved_locked();
  const std::size_t room = limit_ > reserved ? limit_ - reserved : 0;
  return room >= need ? rounded : need - room;
}

}  // namespace tide::allocator::device
