// Pinned arenas under several threads at once: allocations never overlap, every one lies inside
// one registration, and the books balance afterwards. Runs under TSan too (label concurrency).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "allocator/pinned/arena.h"
#include "tests/allocator/device_standin.h"

namespace tide::allocator::pinned {
namespace {

struct Block {
  unsigned char* p;
  std::size_t bytes;
  unsigned char tag;
};

// Each thread fills its blocks with its own tag and checks them before freeing: two threads
// given overlapping memory would see each other's bytes.
void churn(PinnedArena& arena, const testing::DeviceStandin& standin, int thread, int ops,
           std::atomic<int>& failures) {
  std::mt19937_64 rng(1000 + thread);
  std::vector<Block> live;
  auto check_and_free = [&](const Block& b) {
    const std::size_t probes[] = {0, b.bytes / 2, b.bytes - 1};
    for (std::size_t i : probes) {
      if (b.p[i] != b.tag) failures.fetch_add(1);
    }
    arena.deallocate(b.p, b.bytes);
  };
  for (int i = 0; i < ops; ++i) {
    if (!live.empty() && rng() % 2 == 0) {
      const std::size_t k = rng() % live.size();
      check_and_free(live[k]);
      live[k] = live.back();
      live.pop_back();
      continue;
    }
    std::size_t bytes = 0;
    switch (rng() % 3) {
      case 0:
        bytes = 1 + rng() % 2048;
        break;  // jemalloc, small
      case 1:
        bytes = 16 * 1024 + rng() % (48 * 1024);
        break;  // jemalloc, large
      default:
        bytes = 64 * 1024 + rng() % (1536 * 1024);
        break;  // direct, some dedicated
    }
    auto* p = static_cast<unsigned char*>(arena.allocate(bytes));
    if (!standin.registered(p, bytes)) failures.fetch_add(1);
    const auto tag = static_cast<unsigned char>(thread * 16 + i % 16);
    p[0] = tag;
    p[bytes / 2] = tag;
    p[bytes - 1] = tag;
    live.push_back({p, bytes, tag});
  }
  for (const Block& b : live) check_and_free(b);
}

TEST(PinnedConcurrency, ThreadsAllocateAndFreeAtOnce) {
  const testing::DeviceStandin standin;
  const tide_standin_stats before = standin.stats();
  {
    PinnedOptions o;
    o.chunk_bytes = 8 * kMiB;  // small chunks: threads grow and release them concurrently
    o.direct_bytes = 64 * 1024;
    o.retain_bytes = 8 * kMiB;
    o.touch_threads = 2;
    PinnedArena arena(o);
    constexpr int kThreads = 4;
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back(churn, std::ref(arena), std::cref(standin), t, 1500, std::ref(failures));
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(failures.load(), 0);
    const PinnedStats s = arena.stats();
    EXPECT_EQ(s.requested_bytes, 0u);
    EXPECT_EQ(s.allocations, s.frees);
    EXPECT_EQ(s.jemalloc_allocated_bytes, 0u);
    EXPECT_EQ(s.direct_bytes, 0u);
    EXPECT_EQ(s.unregister_failures, 0u);
  }
  const tide_standin_stats after = standin.stats();
  EXPECT_EQ(after.registered_host_bytes, before.registered_host_bytes);
  EXPECT_EQ(after.host_unregisters - before.host_unregisters,
            after.host_registers - before.host_registers);
}

TEST(PinnedConcurrency, ArenasComeAndGoWhileOthersAllocate) {
  const testing::DeviceStandin standin;
  PinnedOptions o;
  o.chunk_bytes = 8 * kMiB;
  o.direct_bytes = 64 * 1024;
  o.touch_threads = 1;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 4; ++round) {
        PinnedArena arena(o);
        churn(arena, standin, t, 200, failures);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace tide::allocator::pinned
