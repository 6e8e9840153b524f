// The power-of-two caching policy of PyTorch's pinned-memory cache (CachingHostAllocator),
// computed on a request sequence: every request is rounded up to a power of two; a freed block
// is cached and reused for the next request of the same rounded size; nothing is given back.
// Pinned bytes are every block ever made.
#pragma once

#include <bit>
#include <cstddef>
#include <map>
#include <unordered_map>

namespace tide::bench {

class Pow2Policy {
 public:
  void allocate(std::size_t id, std::size_t bytes) {
    const std::size_t block = std::bit_ceil(bytes);
    if (auto it = cached_.find(block); it != cached_.end() && it->second > 0) {
      --it->second;
    } else {
      pinned_ += block;
    }
    live_[id] = block;
  }
  void free(std::size_t id) {
    ++cached_[live_.at(id)];
    live_.erase(id);
  }
  std::size_t pinned_bytes() const { return pinned_; }

 private:
  std::size_t pinned_ = 0;
  std::map<std::size_t, std::size_t> cached_;  // rounded size -> cached blocks
  std::unordered_map<std::size_t, std::size_t> live_;
};

}  // namespace tide::bench
