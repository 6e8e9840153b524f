#include "allocator/device/block_pool.h"

#include <cstdint>
#include <utility>

namespace tide::allocator::device {

bool BlockPool::Order::operator()(const Block* a, const Block* b) const {
  const auto sa = reinterpret_cast<std::uintptr_t>(a->stream);
  const auto sb = reinterpret_cast<std::uintptr_t>(b->stream);
  if (sa != sb) return sa < sb;
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

void BlockPool::insert(Block* block) {
  bool counted = false;
  for (auto& [tag, n] : tag_counts_) {
    if (tag == block->stream) {
      ++n;
      counted = true;
      break;
    }
  }
  if (!counted) tag_counts_.emplace_back(block->stream, 1);
  if (spare_nodes_.empty()) {
    blocks_.insert(block);
    return;
  }
  Set::node_type node = std::move(spare_nodes_.back());
  spare_nodes_.pop_back();
  node.value() = block;
  blocks_.insert(std::move(node));
}

void BlockPool::erase(Block* block) {
  auto it = blocks_.find(block);
  if (it == blocks_.end()) return;
  spare_nodes_.push_back(blocks_.extract(it));
  for (std::size_t i = 0; i < tag_counts_.size(); ++i) {
    if (tag_counts_[i].first == block->stream) {
      if (--tag_counts_[i].second == 0) {
        tag_counts_[i] = tag_counts_.back();
        tag_counts_.pop_back();
      }
      break;
    }
  }
}

std::vector<CUstream> BlockPool::tags() const {
  std::vector<CUstream> out;
  for (const auto& [tag, n] : tag_counts_) out.push_back(tag);
  return out;
}

Block* BlockPool::smallest_at_least(CUstream tag, std::size_t size) const {
  Block probe;
  probe.stream = tag;
  probe.size = size;
  probe.ptr = 0;
  auto it = blocks_.lower_bound(&probe);
  if (it == blocks_.end() || (*it)->stream != tag) return nullptr;
  return *it;
}

Block* BlockPool::best_fit(CUstream stream, std::size_t size) const {
  Block* own = smallest_at_least(stream, size);
  if (stream == kAnyStream) return own;
  Block* any = smallest_at_least(kAnyStream, size);
  if (own == nullptr) return any;
  if (any == nullptr) return own;
  return any->size < own->size ? any : own;
}

std::vector<Block*> BlockPool::tagged(CUstream tag) const {
  std::vector<Block*> out;
  Block probe;
  probe.stream = tag;
  probe.size = 0;
  probe.ptr = 0;
  for (auto it = blocks_.lower_bound(&probe); it != blocks_.end() && (*it)->stream == tag; ++it) {
    out.push_back(*it);
  }
  return out;
}

std::vector<Block*> BlockPool::all() const { return {blocks_.begin(), blocks_.end()}; }

std::size_t BlockPool::largest() const {
  std::size_t largest = 0;
  for (const Block* b : blocks_) largest = b->size > largest ? b->size : largest;
  return largest;
}

Block* BlockArena::make() {
  if (spare_.empty()) return &storage_.emplace_back();
  Block* block = spare_.back();
  spare_.pop_back();
  return block;
}

void BlockArena::recycle(Block* block) {
  std::vector<CUstream> uses = std::move(block->uses);
  uses.clear();
  *block = Block{};
  block->uses = std::move(uses);  // keep its capacity
  spare_.push_back(block);
}

}  // namespace tide::allocator::device
