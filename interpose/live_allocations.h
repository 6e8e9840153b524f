// The device allocations a process holds, by address (or by cuMemCreate handle): what a release
// gives back, and to which device and call site it is charged.
//
// An open-addressing table in 16 shards, each behind its own mutex: an insert or removal takes a
// few tens of nanoseconds and allocates only when a shard grows.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

#include <optional>
#include <vector>
#include "interpose/spin_lock.h"

#include "interpose/entry_points.h"

namespace tide::interpose {

struct Allocation {
  std::uint64_t bytes = 0;
  std::int32_t device = 0;
  std::uint32_t site = 0;  // CallStacks site, 0 when not captured
  Kind api = Kind::count;
};

class LiveAllocations {
 public:
  // Returns the allocation previously recorded at `key`, if any (a release the hooks missed).
  std::optional<Allocation> insert(std::uint64_t key, const Allocation& allocation);
  std::optional<Allocation> take(std::uint64_t key);
  std::optional<Allocation> find(std::uint64_t key) const;
  std::uint64_t size() const;

  void prepare_fork();
  void parent_after_fork();
  void child_after_fork();  // the child holds none of the parent's device memory

 private:
  static constexpr std::uint64_t kEmpty = 0;
  static constexpr std::uint64_t kTombstone = ~std::uint64_t{0};
  static constexpr std::size_t kShards = 16;

  struct Entry {
    std::uint64_t key = kEmpty;
    Allocation value;
  };
  struct Shard {
    mutable SpinLock mutex;
    std::vector<Entry> entries;  // size 0 or a power of two
    std::size_t occupied = 0;    // live entries and tombstones
    std::size_t live = 0;
  };

  static void grow(Shard& shard);
  static const Entry* find(const Shard& shard, std::uint64_t key, std::uint64_t hash);
  static Entry* find(Shard& shard, std::uint64_t key, std::uint64_t hash);

  std::array<Shard, kShards> shards_;
};

}  // namespace tide::interpose
