#include "allocator/pinned/node_limit.h"

#include <atomic>
#include <cstdint>
#include <string>

#include "config/bytes.h"
#include "config/env.h"
#include "config/knobs.h"
#include "config/node.h"

namespace tide::allocator::pinned {
namespace {

std::atomic<std::uint64_t> pinned_now{0};
std::atomic<std::uint64_t> pinned_peak{0};

struct Limit {
  std::uint64_t node = 0;
  config::LocalRanks ranks;
};

const Limit& limit() {
  static const Limit l = [] {
    Limit out;
    out.node = config::env_bytes("TIDE_NODE_PINNED_LIMIT", 1, UINT64_MAX, config::kLimitAccepts)
                   .value_or(0);
    out.ranks = config::local_ranks();
    return out;
  }();
  return l;
}

}  // namespace

NodePinned node_pinned() {
  const Limit& l = limit();
  NodePinned n;
  n.node_limit_bytes = l.node;
  n.local_rank = l.ranks.rank;
  n.local_ranks = l.ranks.size;
  n.rank_limit_bytes = l.node / static_cast<std::uint64_t>(l.ranks.size);
  if (l.node != 0 && n.rank_limit_bytes == 0) n.rank_limit_bytes = 1;  // a cap, never "none"
  n.pinned_bytes = pinned_now.load(std::memory_order_relaxed);
  n.peak_pinned_bytes = pinned_peak.load(std::memory_order_relaxed);
  return n;
}

void reserve_pinned(std::uint64_t bytes) {
  const NodePinned n = node_pinned();
  std::uint64_t now = pinned_now.load(std::memory_order_relaxed);
  for (;;) {
    if (n.rank_limit_bytes != 0 &&
        (bytes > n.rank_limit_bytes || now > n.rank_limit_bytes - bytes)) {
      const auto b =
          config::format_bytes_apart({bytes, now + bytes, n.rank_limit_bytes, n.node_limit_bytes});
      throw PinnedLimitError("tide: pinned memory: growing by " + b[0] + " would pin " + b[1] +
                             " in this process, over local rank " + std::to_string(n.local_rank) +
                             "'s share " + b[2] + " of TIDE_NODE_PINNED_LIMIT=" + b[3] +
                             " (LOCAL_WORLD_SIZE=" + std::to_string(n.local_ranks) +
                             "): raise the limit, or keep less optimizer state on this node");
    }
    if (pinned_now.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed)) break;
  }
  std::uint64_t peak = pinned_peak.load(std::memory_order_relaxed);
  while (now + bytes > peak &&
         !pinned_peak.compare_exchange_weak(peak, now + bytes, std::memory_order_relaxed)) {
  }
}

void release_pinned(std::uint64_t bytes) noexcept {
  pinned_now.fetch_sub(bytes, std::memory_order_relaxed);
}

}  // namespace tide::allocator::pinned
