// The free blocks of one pool, indexed for best fit, and the storage of Block objects.
//
// Free blocks are ordered by (stream tag, size, address): a request on stream S looks for the
// smallest block tagged S and the smallest tagged kAnyStream and takes the smaller of the two.
// Neither structure allocates host memory once warm (set nodes and Block objects are
// recycled), so that the cached allocate/free path costs no malloc.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <deque>
#include <set>
#include <utility>
#include <vector>

#include "allocator/device/block.h"

namespace tide::allocator::device {

class BlockPool {
 public:
  void insert(Block* block);
  void erase(Block* block);
  // The smallest free block of at least `size` bytes usable on `stream` (tagged `stream` or
  // kAnyStream); ties go to the block tagged `stream`. Null if none.
  Block* best_fit(CUstream stream, std::size_t size) const;
  // The free blocks tagged `tag`.
  std::vector<Block*> tagged(CUstream tag) const;
  // The distinct tags of the free blocks.
  std::vector<CUstream> tags() const;
  // Every free block (for statistics and release).
  std::vector<Block*> all() const;
  bool empty() const { return blocks_.empty(); }
  std::size_t count() const { return blocks_.size(); }
  std::size_t largest() const;

 private:
  struct Order {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Set = std::set<Block*, Order>;
  Block* smallest_at_least(CUstream tag, std::size_t size) const;

  Set blocks_;
  std::vector<Set::node_type> spare_nodes_;
  std::vector<std::pair<CUstream, std::size_t>> tag_counts_;  // few streams: a vector
};

// Block objects, recycled.
class BlockArena {
 public:
  Block* make();
  void recycle(Block* block);

 private:
  std::deque<Block> storage_;
  std::vector<Block*> spare_;
};

}  // namespace tide::allocator::device
