// The device caching allocator on the stand-in driver: caching, rounding, splitting and merging,
// growable and fixed segments, releasing, limits, statistics, configuration.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <set>
#include <vector>

#include "allocator/device/caching_allocator.h"
#include "allocator/device/config.h"
#include "config/env.h"
#include "driver/context.h"
#include "driver/cuda_api.h"
#include "driver/error.h"
#include "tests/allocator/device_standin.h"

namespace tide::allocator::device {
namespace {

using telemetry::OomRecord;

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::uintptr_t addr(void* p) { return reinterpret_cast<std::uintptr_t>(p); }

class CachingAllocatorTest : public ::testing::Test {
 protected:
  static AllocatorConfig config(bool growable = true, std::size_t thread_cache = 4 * kMiB) {
    AllocatorConfig c;
    c.growable = growable;
    c.thread_cache_bytes = thread_cache;
    return c;
  }

  driver::CurrentContext context_{0};
  testing::DeviceStandin standin_;
};

TEST_F(CachingAllocatorTest, RoundsRequestsUpTo512ByteMultiples) {
  CachingAllocator a(0, config());
  EXPECT_EQ(a.round_size(1), 512u);
  EXPECT_EQ(a.round_size(512), 512u);
  EXPECT_EQ(a.round_size(513), 1024u);
  EXPECT_EQ(a.round_size(kMiB), kMiB);
  EXPECT_EQ(a.round_size(3 * kMiB + 1), 3 * kMiB + 512);
  AllocatorConfig coarse = config();
  coarse.round_divisions = 4;  // 4 steps per power of two above 1 MiB
  CachingAllocator b(0, coarse);
  EXPECT_EQ(b.round_size(kMiB + 1), kMiB + kMiB / 4);
  EXPECT_EQ(b.round_size(5 * kMiB), 5 * kMiB);
  EXPECT_EQ(b.round_size(5 * kMiB + 1), 6 * kMiB);
  EXPECT_EQ(b.round_size(1000), 1024u);  // small requests keep 512-byte rounding
}

TEST_F(CachingAllocatorTest, CachedAllocateAndFreeMakeNoDriverCall) {
  for (std::size_t cache : {std::size_t{0}, 4 * kMiB}) {  // without and with thread caches
    CachingAllocator a(0, config(true, cache));
    const std::vector<std::size_t> sizes = {100, 4096, 200'000, kMiB, 3 * kMiB, 40 * kMiB};
    auto round = [&] {
      std::vector<void*> ptrs;
      for (std::size_t s : sizes) ptrs.push_back(a.allocate(s, nullptr));
      for (std::size_t i = 0; i < sizes.size(); ++i) a.deallocate(ptrs[i], sizes[i], nullptr);
    };
    round();  // warm: segments come from the driver
    standin_.reset_stats();
    for (int i = 0; i < 50; ++i) round();
    EXPECT_EQ(standin_.stats().driver_calls, 0u) << "thread cache bytes " << cache;
  }
}

TEST_F(CachingAllocatorTest, SmallBlocksShareA2MiBSegmentAndMergeWhenFreed) {
  CachingAllocator a(0, config(true, 0));
  void* p = a.allocate(256 * 1024, nullptr);
  void* q = a.allocate(256 * 1024, nullptr);
  void* r = a.allocate(256 * 1024, nullptr);
  EXPECT_EQ(addr(q) - addr(p), 256u * 1024);  // split from one segment, in address order
  EXPECT_EQ(addr(r) - addr(q), 256u * 1024);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.segment[kSmallPool].current, 1u);
  EXPECT_EQ(s.reserved_bytes[kSmallPool].current, 2 * kMiB);
  EXPECT_EQ(s.allocated_bytes[kSmallPool].current, 768u * 1024);
  a.deallocate(p, 256 * 1024, nullptr);
  a.deallocate(r, 256 * 1024, nullptr);
  s = a.stats();
  EXPECT_EQ(s.inactive_split[kSmallPool], 2u);  // p's block, and r's merged with the rest
  a.deallocate(q, 256 * 1024, nullptr);
  s = a.stats();
  EXPECT_EQ(s.inactive_split_bytes[kAllPools], 0u);
  EXPECT_EQ(s.largest_free_block, 2 * kMiB);  // all three merged back with the rest
  void* big = a.allocate(kMiB, nullptr);      // fits in the merged segment
  EXPECT_EQ(addr(big), addr(p));
  EXPECT_EQ(a.stats().segment[kSmallPool].current, 1u);
  a.deallocate(big, kMiB, nullptr);
}

TEST_F(CachingAllocatorTest, BestFitTakesTheSmallestFreeBlockThatFits) {
  CachingAllocator a(0, config(true, 0));
  void* a1 = a.allocate(5 * kMiB, nullptr);
  void* sep1 = a.allocate(2 * kMiB, nullptr);
  void* a2 = a.allocate(3 * kMiB, nullptr);
  void* sep2 = a.allocate(2 * kMiB, nullptr);
  a.deallocate(a1, 5 * kMiB, nullptr);
  a.deallocate(a2, 3 * kMiB, nullptr);
  void* p = a.allocate(2 * kMiB + kMiB / 2, nullptr);
  EXPECT_EQ(addr(p), addr(a2));  // the 3 MiB hole, not the 5 MiB one
  void* q = a.allocate(4 * kMiB, nullptr);
  EXPECT_EQ(addr(q), addr(a1));
  for (auto [ptr, size] : {std::pair{p, 2 * kMiB + kMiB / 2}, std::pair{q, 4 * kMiB},
                           std::pair{sep1, 2 * kMiB}, std::pair{sep2, 2 * kMiB}}) {
    a.deallocate(ptr, size, nullptr);
  }
}

TEST_F(CachingAllocatorTest, GrowableSegmentGrowsOneRange) {
  CachingAllocator a(0, config(true));
  const std::uint64_t in_use = standin_.bytes_in_use();
  standin_.reset_stats();
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t mib : {3, 8, 17, 30, 5}) {
    blocks.emplace_back(a.allocate(mib * kMiB, nullptr), mib * kMiB);
    ASSERT_NE(blocks.back().first, nullptr);
  }
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.growable, 1u);
  EXPECT_EQ(s.segment[kLargePool].current, 1u);   // one range, not one segment per size
  EXPECT_EQ(standin_.stats().device_allocs, 0u);  // no cuMemAlloc: cuMemCreate'd pages
  EXPECT_EQ(s.reserved_bytes[kLargePool].current, 64 * kMiB);  // 63 MiB in 2 MiB pages
  // In pieces of several pages (growth_test.cpp), one driver allocation and mapping each.
  EXPECT_LT(s.num_device_alloc, 32u);
  EXPECT_EQ(standin_.stats().mem_creates, s.num_device_alloc);
  // Contiguous: each block right after the previous one.
  for (std::size_t i = 1; i < blocks.size(); ++i) {
    EXPECT_EQ(addr(blocks[i].first), addr(blocks[i - 1].first) + blocks[i - 1].second);
  }
  // Free the middle ones: the freed range is reused for a bigger block without growing.
  a.deallocate(blocks[1].first, blocks[1].second, nullptr);
  a.deallocate(blocks[2].first, blocks[2].second, nullptr);
  void* merged = a.allocate(25 * kMiB, nullptr);
  EXPECT_EQ(addr(merged), addr(blocks[1].first));
  EXPECT_EQ(a.stats().reserved_bytes[kLargePool].current, 64 * kMiB);
  a.deallocate(merged, 25 * kMiB, nullptr);
  for (std::size_t i : {0u, 3u, 4u}) a.deallocate(blocks[i].first, blocks[i].second, nullptr);
  a.empty_cache();
  s = a.stats();
  EXPECT_EQ(s.reserved_bytes[kAllPools].current, 0u);
  EXPECT_EQ(s.num_device_free, a.stats().num_device_alloc);
  EXPECT_EQ(standin_.bytes_in_use(), in_use);
}

TEST_F(CachingAllocatorTest, FixedSegmentsWhenGrowableIsOff) {
  CachingAllocator a(0, config(false));
  standin_.reset_stats();
  void* p = a.allocate(3 * kMiB, nullptr);  // shares a 20 MiB segment
  void* q = a.allocate(5 * kMiB, nullptr);
  void* r = a.allocate(30 * kMiB, nullptr);  // a segment of its own
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.growable, 0u);
  EXPECT_EQ(s.segment[kLargePool].current, 2u);
  EXPECT_EQ(s.reserved_bytes[kLargePool].current, 50 * kMiB);
  EXPECT_EQ(standin_.stats().device_allocs, 2u);
  EXPECT_EQ(standin_.stats().mem_creates, 0u);
  a.deallocate(p, 3 * kMiB, nullptr);
  a.deallocate(q, 5 * kMiB, nullptr);
  a.deallocate(r, 30 * kMiB, nullptr);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes[kAllPools].current, 0u);
  EXPECT_EQ(standin_.stats().device_frees, 2u);
}

TEST_F(CachingAllocatorTest, EmptyCacheGivesBackOnlyWhatIsFree) {
  CachingAllocator a(0, config(true));
  const std::uint64_t in_use = standin_.bytes_in_use();
  void* keep = a.allocate(4 * kMiB, nullptr);
  void* drop = a.allocate(16 * kMiB, nullptr);
  void* small_keep = a.allocate(1000, nullptr);
  void* small_drop = a.allocate(300'000, nullptr);
  a.deallocate(drop, 16 * kMiB, nullptr);
  a.deallocate(small_drop, 300'000, nullptr);
  a.empty_cache();
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.reserved_bytes[kLargePool].current, 4 * kMiB);  // keep's pages only
  EXPECT_EQ(s.reserved_bytes[kSmallPool].current, 2 * kMiB);  // small_keep's segment
  EXPECT_EQ(s.thread_cached_bytes, 0u);
  a.deallocate(keep, 4 * kMiB, nullptr);
  a.deallocate(small_keep, 1000, nullptr);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes[kAllPools].current, 0u);
  EXPECT_EQ(standin_.bytes_in_use(), in_use);
}

TEST_F(CachingAllocatorTest, StatisticsFollowPyTorchsMeaning) {
  CachingAllocator a(0, config(true, 0));
  void* p = a.allocate(1000, nullptr);          // 1024-byte block
  void* q = a.allocate(3 * kMiB + 1, nullptr);  // 3 MiB + 512
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.allocated_bytes[kAllPools].current, 1024 + 3 * kMiB + 512);
  EXPECT_EQ(s.requested_bytes[kAllPools].current, 1000 + 3 * kMiB + 1);
  EXPECT_EQ(s.allocation[kAllPools].current, 2u);
  EXPECT_EQ(s.allocation[kSmallPool].current, 1u);
  EXPECT_EQ(s.allocation[kLargePool].current, 1u);
  EXPECT_EQ(s.active_bytes[kAllPools].current, s.allocated_bytes[kAllPools].current);
  a.deallocate(q, 3 * kMiB + 1, nullptr);
  s = a.stats();
  EXPECT_EQ(s.allocated_bytes[kAllPools].current, 1024u);
  EXPECT_EQ(s.allocated_bytes[kAllPools].peak, 1024 + 3 * kMiB + 512);
  EXPECT_EQ(s.allocated_bytes[kAllPools].allocated, 1024 + 3 * kMiB + 512);
  EXPECT_EQ(s.allocated_bytes[kAllPools].freed, 3 * kMiB + 512);
  EXPECT_EQ(s.allocation[kAllPools].allocated, 2u);
  EXPECT_EQ(s.allocation[kAllPools].freed, 1u);
  a.reset_peak_stats();
  EXPECT_EQ(a.stats().allocated_bytes[kAllPools].peak, 1024u);
  a.reset_accumulated_stats();
  EXPECT_EQ(a.stats().allocation[kAllPools].allocated, 0u);
  a.deallocate(p, 1000, nullptr);
  EXPECT_EQ(a.stats().allocated_bytes[kAllPools].current, 0u);
}

TEST_F(CachingAllocatorTest, ThreadCacheIsCountedAsFreeAndReusedOnItsStream) {
  CachingAllocator a(0, config(true, 4 * kMiB));
  void* p = a.allocate(10'000, nullptr);
  a.deallocate(p, 10'000, nullptr);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.thread_cached_bytes, 10'240u);
  EXPECT_EQ(s.allocated_bytes[kAllPools].current, 0u);
  EXPECT_EQ(s.requested_bytes[kAllPools].current, 0u);
  EXPECT_EQ(s.allocation[kAllPools].current, 0u);
  EXPECT_EQ(s.allocation[kAllPools].freed, 1u);
  EXPECT_EQ(s.thread_cache_hits, 0u);
  void* q = a.allocate(10'200, nullptr);  // same rounded size, same stream: the cached block
  EXPECT_EQ(q, p);
  s = a.stats();
  EXPECT_EQ(s.requested_bytes[kAllPools].current, 10'200u);
  EXPECT_EQ(s.allocation[kAllPools].allocated, 2u);
  EXPECT_EQ(s.allocation[kSmallPool].allocated, 2u);
  EXPECT_EQ(s.thread_cache_hits, 1u);  // of the two: the second took no lock
  a.reset_accumulated_stats();
  EXPECT_EQ(a.stats().thread_cache_hits, 0u);
  a.deallocate(q, 10'200, nullptr);
  a.empty_cache();  // takes the block back from the thread's cache too
  EXPECT_EQ(a.stats().thread_cached_bytes, 0u);
  EXPECT_EQ(a.stats().reserved_bytes[kAllPools].current, 0u);
}

TEST_F(CachingAllocatorTest, FreeingAnUnknownAddressIsAnError) {
  CachingAllocator a(0, config(true, 0));
  void* p = a.allocate(4 * kMiB, nullptr);
  a.deallocate(p, 4 * kMiB, nullptr);
  EXPECT_THROW(a.deallocate(p, 4 * kMiB, nullptr), std::invalid_argument);
  EXPECT_THROW(a.record_stream(p, nullptr), std::invalid_argument);
  CachingAllocator cached(0, config(true, 4 * kMiB));  // a small block, freed into the cache
  void* s = cached.allocate(4096, nullptr);
  cached.deallocate(s, 4096, nullptr);
  EXPECT_THROW(cached.deallocate(s, 4096, nullptr), std::invalid_argument);
}

TEST_F(CachingAllocatorTest, HeadroomBlocksAreCachedBlocksFreedTheirOwnWay) {
  CachingAllocator a(0, config());
  void* big = a.allocate(8 * kMiB, nullptr);
  ASSERT_NE(big, nullptr);
  a.deallocate(big, 8 * kMiB, nullptr);
  const std::uint64_t calls = standin_.device_allocations();
  // From the cache, small ones too (never through a thread's cache: they are freed by the core).
  void* buffer = a.allocate_from_headroom(8 * kMiB, nullptr);
  void* counters = a.allocate_from_headroom(64, nullptr);
  ASSERT_NE(buffer, nullptr);
  ASSERT_NE(counters, nullptr);
  EXPECT_EQ(addr(buffer), addr(big));
  EXPECT_EQ(a.usage().live, 8 * kMiB + 512);
  // Each kind of block is given back the way it came.
  void* plain = a.allocate(64, nullptr);
  EXPECT_THROW(a.deallocate_from_headroom(plain, 64, nullptr), std::invalid_argument);
  a.deallocate(plain, 64, nullptr);
  a.deallocate_from_headroom(counters, 64, nullptr);
  a.deallocate_from_headroom(buffer, 8 * kMiB, nullptr);
  EXPECT_EQ(a.usage().live, 0u);
  EXPECT_LE(standin_.device_allocations(), calls + 1);  // at most the small pool's segment
  // Too large for any device: null, as allocate() gives.
  EXPECT_EQ(a.allocate_from_headroom(std::size_t{1} << 62, nullptr), nullptr);
}

TEST_F(CachingAllocatorTest, MemoryLimitCapsWhatIsReserved) {
  AllocatorConfig c = config(true, 0);
  c.max_bytes = 64 * kMiB;
  CachingAllocator a(0, c);
  EXPECT_EQ(a.limit(), 64 * kMiB);
  void* p = a.allocate(48 * kMiB, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(a.allocate(32 * kMiB, nullptr), nullptr);
  const std::vector<OomRecord> ooms = a.ooms();
  ASSERT_EQ(ooms.size(), 1u);
  EXPECT_TRUE(ooms[0].limit_reached);
  EXPECT_EQ(ooms[0].limit, 64 * kMiB);
  EXPECT_EQ(ooms[0].requested, 32 * kMiB);
  EXPECT_EQ(a.stats().num_ooms, 1u);
  a.deallocate(p, 48 * kMiB, nullptr);
  void* q = a.allocate(32 * kMiB, nullptr);
  EXPECT_NE(q, nullptr);
  a.deallocate(q, 32 * kMiB, nullptr);
  a.set_memory_fraction(0.5);
  EXPECT_EQ(a.limit(), 64 * kMiB);  // TIDE_ALLOC_MAX_BYTES still applies
  EXPECT_THROW(a.set_memory_fraction(0.0), std::invalid_argument);
  EXPECT_THROW(a.set_memory_fraction(1.5), std::invalid_argument);
}

TEST_F(CachingAllocatorTest, KeepsTheCallersContextCurrent) {
  CachingAllocator a(0, config(true, 0));
  // No context current on this thread: the allocator's slow path uses the device's primary
  // context and leaves none current afterwards.
  TIDE_CU(cuCtxSetCurrent, nullptr);
  void* p = a.allocate(8 * kMiB, nullptr);
  EXPECT_NE(p, nullptr);
  CUcontext current = reinterpret_cast<CUcontext>(1);
  TIDE_CU(cuCtxGetCurrent, &current);
  EXPECT_EQ(current, nullptr);
  TIDE_CU(cuCtxSetCurrent, context_.get());  // back, as the fixture left it
  a.deallocate(p, 8 * kMiB, nullptr);
  a.empty_cache();
  TIDE_CU(cuCtxGetCurrent, &current);
  EXPECT_EQ(current, context_.get());
}

TEST(AllocatorConfigTest, ReadsTheEnvironmentStrictly) {
  struct Var {
    const char* name;
    const char* value;
  };
  auto with = [](Var v, auto&& body) {
    setenv(v.name, v.value, 1);
    body();
    unsetenv(v.name);
  };
  with({"TIDE_ALLOC_MEMORY_FRACTION", "0.5"},
       [] { EXPECT_EQ(AllocatorConfig::from_environment().memory_fraction, 0.5); });
  with({"TIDE_ALLOC_MEMORY_FRACTION", "0"},
       [] { EXPECT_THROW(AllocatorConfig::from_environment(), config::EnvError); });
  with({"TIDE_ALLOC_MEMORY_FRACTION", "half"},
       [] { EXPECT_THROW(AllocatorConfig::from_environment(), config::EnvError); });
  with({"TIDE_ALLOC_MAX_BYTES", "6GiB"},
       [] { EXPECT_EQ(AllocatorConfig::from_environment().max_bytes, std::uint64_t{6} << 30); });
  with({"TIDE_ALLOC_GROWABLE", "off"},
       [] { EXPECT_FALSE(AllocatorConfig::from_environment().growable); });
  with({"TIDE_ALLOC_GROWABLE", "maybe"},
       [] { EXPECT_THROW(AllocatorConfig::from_environment(), config::EnvError); });
  with({"TIDE_ALLOC_ROUND_DIVISIONS", "65"},
       [] { EXPECT_THROW(AllocatorConfig::from_environment(), config::EnvError); });
  with({"TIDE_ALLOC_THREAD_CACHE", "0"},
       [] { EXPECT_EQ(AllocatorConfig::from_environment().thread_cache_bytes, 0u); });
  with({"TIDE_TELEMETRY_SAMPLES", "10"},
       [] { EXPECT_THROW(AllocatorConfig::from_environment(), config::EnvError); });
  with({"TIDE_TELEMETRY_RESOLUTION", "1MiB"}, [] {
    EXPECT_EQ(AllocatorConfig::from_environment().telemetry_resolution, std::uint64_t{1} << 20);
  });
  with({"TIDE_HEADROOM_MARGIN", "0.6"},
       [] { EXPECT_THROW(AllocatorConfig::from_environment(), config::EnvError); });
  with({"TIDE_HEADROOM_ITERATIONS", "3"},
       [] { EXPECT_EQ(AllocatorConfig::from_environment().headroom_iterations, 3); });
}

}  // namespace
}  // namespace tide::allocator::device
