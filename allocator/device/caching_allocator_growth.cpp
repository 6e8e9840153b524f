// The caching allocator's memory from the driver: growing a pool (the growable segment's pieces,
// or a fixed segment) and giving cached memory back (whole free fixed segments, whole free pieces
// of the growable one).
#include <algorithm>
#include <memory>
#include <utility>

#include "allocator/device/caching_allocator.h"
#include "allocator/device/caching_allocator_parts.h"
#include "driver/error.h"
#include "driver/virtual_memory.h"

namespace tide::allocator::device {
namespace {

// The growable segment grows in steps of an eighth of what it maps and of the room the limit
// leaves, between one page and kMaxStep: few driver calls while a workload climbs (as RMM's pool
// grows geometrically), little surplus when memory is short. The surplus is a free block next to
// the unbacked rest, used before the segment grows again: peak reserved exceeds a page-by-page
// growth's by at most one step (12.5%, and at most kMaxStep) on a climb.
constexpr std::size_t kMaxStep = std::size_t{64} << 20;
std::size_t growth_step(std::size_t mapped, std::size_t room, std::size_t page) {
  return std::clamp(align_down(std::min(mapped, room) / 8, page), page, kMaxStep);
}
// Pieces (one driver allocation and mapping each, given back whole: growable_segment.h) of at
// most kMaxStep, a sixteenth of the limit and an eighth of the room it leaves: what a release
// cannot give back because a live block holds part of a piece stays small beside the memory
// there is, and near the limit, where giving back matters most, pieces are single pages.
std::size_t max_piece(std::size_t limit, std::size_t room, std::size_t page) {
  return std::clamp(align_down(std::min(limit / 16, room / 8), page), page, kMaxStep);
}

}  // namespace

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
  // Grow by a step when the request needs less: into the hole, away from the free block the
  // request joins (a whole hole between two free blocks is mapped as it is). Never past the limit.
  const std::size_t room = limit_ - reserved_locked();
  const std::size_t step = growth_step(vm.mapped_bytes(), room, page);
  const std::size_t piece = max_piece(limit_, room, page);
  const std::size_t hole_offset = best_hole->ptr - growable_->base;
  std::size_t grow_offset = best_offset;
  std::size_t grow_bytes = best_bytes;
  if (best_bytes < step && best_bytes < best_hole->size) {
    const std::size_t want = std::min({step, best_hole->size, align_down(room, page)});
    if (want > best_bytes) {
      grow_bytes = want;
      // The end of the hole (next to a free block after it): extend downwards.
      if (best_offset != hole_offset) grow_offset = best_offset + best_bytes - want;
    }
  }
  std::size_t pieces = 0;
  try {
    pieces = vm.map(grow_offset, grow_bytes, piece);
  } catch (const driver::CudaError& e) {
    if (!is_out_of_memory(e)) throw;
    if (grow_bytes == best_bytes) return nullptr;
    // The device has less free than the step: what the request needs, if that fits.
    grow_offset = best_offset;
    grow_bytes = best_bytes;
    try {
      pieces = vm.map(grow_offset, grow_bytes, piece);
    } catch (const driver::CudaError& again) {
      if (is_out_of_memory(again)) return nullptr;
      throw;
    }
  }
  best_offset = grow_offset;
  best_bytes = grow_bytes;
  num_device_alloc_ += pieces;
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
  // The growable segment gives back every whole piece inside a free block.
  GrowableRange& vm = *growable_->vm;
  const std::size_t page = vm.page_size();
  const CUdeviceptr base = growable_->base;
  for (Block* b = growable_->first; b != nullptr;) {
    Block* next = b->next;
    if (b->state == BlockState::kFree && b->stream == kAnyStream) {
      const std::size_t first = align_up(b->ptr - base, page);
      const std::size_t last = align_down(b->ptr + b->size - base, page);
      // Pieces go back whole: those wholly inside the block.
      const auto [lo, length] = last > first ? vm.whole_pieces(first, last - first)
                                             : std::pair<std::size_t, std::size_t>{};
      const std::size_t hi = lo + length;
      if (length > 0) {
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
  const driver::ContextScope scope(context_);
  drain_thread_caches_locked();
  synchronize_all_locked();
  release_cached_locked();
  if (recorder_.active()) recorder_.empty_cache(now_locked());
  on_change_locked();
}

}  // namespace tide::allocator::device
