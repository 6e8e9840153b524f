// The pinned memory a node may hold, and this rank's share of it (TIDE_NODE_PINNED_LIMIT).
//
// Ranks on one host pin host memory from the same RAM: without a cap, each grows its arenas as if
// alone, and the node runs out of memory (or the kernel's OOM killer picks a rank). The knob caps
// the node; each of its LOCAL_WORLD_SIZE ranks may pin an equal share, counted over every arena
// of the process. Growing past the share is a PinnedLimitError at the growth, naming the knob.
#pragma once

#include <cstdint>
#include <string>

#include "allocator/pinned/memory_error.h"

namespace tide::allocator::pinned {

struct NodePinned {
  std::uint64_t node_limit_bytes = 0;  // TIDE_NODE_PINNED_LIMIT; 0: no limit
  std::uint64_t rank_limit_bytes = 0;  // node_limit_bytes / local_ranks; 0: no limit
  int local_rank = 0;
  int local_ranks = 1;
  std::uint64_t pinned_bytes = 0;  // this process, every arena
  std::uint64_t peak_pinned_bytes = 0;
};

// The knob and the local ranks (read once; throws config::EnvError for a bad value) and what this
// process pins now.
NodePinned node_pinned();

// Counts `bytes` more pinned by this process, or throws PinnedLimitError (counting nothing) when
// that would pass the rank's share. Thread-safe.
void reserve_pinned(std::uint64_t bytes);
void release_pinned(std::uint64_t bytes) noexcept;

}  // namespace tide::allocator::pinned
