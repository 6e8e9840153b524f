#include "interpose/live_allocations.h"

namespace tide::interpose {
namespace {

// splitmix64's finaliser: device addresses are aligned and clustered, their low bits say little.
std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

constexpr std::size_t kShardBits = 4;

}  // namespace

LiveAllocations::Entry* LiveAllocations::find(Shard& shard, std::uint64_t key, std::uint64_t hash) {
  return const_cast<Entry*>(find(static_cast<const Shard&>(shard), key, hash));
}

const LiveAllocations::Entry* LiveAllocations::find(const Shard& shard, std::uint64_t key,
                                                    std::uint64_t hash) {
  if (shard.entries.empty()) return nullptr;
  const std::size_t mask = shard.entries.size() - 1;
  for (std::size_t i = hash & mask;; i = (i + 1) & mask) {
    const Entry& e = shard.entries[i];
    if (e.key == key) return &e;
    if (e.key == kEmpty) return nullptr;
  }
}

void LiveAllocations::grow(Shard& shard) {
  std::vector<Entry> old;
  old.swap(shard.entries);
  std::size_t size = old.empty() ? 256 : old.size();
  // Double only when live entries need it; otherwise the rehash just clears tombstones.
  if (shard.live * 2 >= size / 2) size *= 2;
  shard.entries.assign(size, Entry{});
  shard.occupied = shard.live;
  const std::size_t mask = size - 1;
  for (const Entry& e : old) {
    if (e.key == kEmpty || e.key == kTombstone) continue;
    std::size_t i = (mix(e.key) >> kShardBits) & mask;
    while (shard.entries[i].key != kEmpty) i = (i + 1) & mask;
    shard.entries[i] = e;
  }
}

std::optional<Allocation> LiveAllocations::insert(std::uint64_t key, const Allocation& allocation) {
  if (key == kEmpty || key == kTombstone) return std::nullopt;
  const std::uint64_t h = mix(key);
  Shard& shard = shards_[h & (kShards - 1)];
  const std::uint64_t hash = h >> kShardBits;
  const std::lock_guard lock(shard.mutex);
  if (Entry* e = find(shard, key, hash)) {
    const Allocation previous = e->value;
    e->value = allocation;
    return previous;
  }
  if ((shard.occupied + 1) * 2 > shard.entries.size()) grow(shard);
  const std::size_t mask = shard.entries.size() - 1;
  std::size_t i = hash & mask;
  while (shard.entries[i].key != kEmpty && shard.entries[i].key != kTombstone) {
    i = (i + 1) & mask;
  }
  if (shard.entries[i].key == kEmpty) ++shard.occupied;
  shard.entries[i] = {key, allocation};
  ++shard.live;
  return std::nullopt;
}

std::optional<Allocation> LiveAllocations::take(std::uint64_t key) {
  if (key == kEmpty || key == kTombstone) return std::nullopt;
  const std::uint64_t h = mix(key);
  Shard& shard = shards_[h & (kShards - 1)];
  const std::lock_guard lock(shard.mutex);
  Entry* e = find(shard, key, h >> kShardBits);
  if (e == nullptr) return std::nullopt;
  const Allocation value = e->value;
  e->key = kTombstone;
  --shard.live;
  return value;
}

std::optional<Allocation> LiveAllocations::find(std::uint64_t key) const {
  if (key == kEmpty || key == kTombstone) return std::nullopt;
  const std::uint64_t h = mix(key);
  const Shard& shard = shards_[h & (kShards - 1)];
  const std::lock_guard lock(shard.mutex);
  const Entry* e = find(shard, key, h >> kShardBits);
  return e != nullptr ? std::optional<Allocation>(e->value) : std::nullopt;
}

std::uint64_t LiveAllocations::size() const {
  std::uint64_t total = 0;
  for (const Shard& shard : shards_) {
    const std::lock_guard lock(shard.mutex);
    total += shard.live;
  }
  return total;
}

void LiveAllocations::prepare_fork() {
  for (Shard& shard : shards_) shard.mutex.lock();
}

void LiveAllocations::parent_after_fork() {
  for (Shard& shard : shards_) shard.mutex.unlock();
}

void LiveAllocations::child_after_fork() {
  for (Shard& shard : shards_) {
    shard.entries.clear();
    shard.occupied = 0;
    shard.live = 0;
    shard.mutex.unlock();
  }
}

}  // namespace tide::interpose
