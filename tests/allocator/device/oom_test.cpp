// Out of memory at the stand-in's capacity: the allocator gives its cache back (after waiting
// for pending work) and retries; when that cannot help, it returns null and records the state.
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "allocator/device/caching_allocator.h"
#include "driver/context.h"
#include "driver/memory.h"
#include "driver/stream.h"
#include "tests/allocator/device_standin.h"

namespace tide::allocator::device {
namespace {

using telemetry::OomRecord;

constexpr std::size_t kMiB = std::size_t{1} << 20;

class OomTest : public ::testing::Test {
 protected:
  void SetUp() override {
    capacity_ = standin_.capacity();
    standin_.set_capacity(64 * kMiB);
  }
  void TearDown() override {
    standin_.set_capacity(capacity_);
    standin_.set_bandwidth(0, 0);
    standin_.fail_alloc(0);
  }
  static AllocatorConfig config(bool growable) {
    AllocatorConfig c;
    c.growable = growable;
    c.thread_cache_bytes = 0;
    return c;
  }

  testing::DeviceStandin standin_;
  driver::CurrentContext context_{0};
  std::uint64_t capacity_ = 0;
};

TEST_F(OomTest, ReleasingTheCacheAndRetryingSucceedsWhenItCan) {
  CachingAllocator a(0, config(false));
  void* cached = a.allocate(20 * kMiB, nullptr);
  a.deallocate(cached, 20 * kMiB, nullptr);
  // Someone else takes 30 MiB of the device: 20 cached + 30 + 24 more is over 64.
  driver::DeviceBuffer other(30 * kMiB);
  void* p = a.allocate(24 * kMiB, nullptr);
  ASSERT_NE(p, nullptr);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.num_alloc_retries, 1u);
  EXPECT_EQ(s.num_ooms, 0u);
  EXPECT_EQ(s.reserved_bytes[kAllPools].current, 24 * kMiB);  // the 20 MiB went back
  a.deallocate(p, 24 * kMiB, nullptr);
}

TEST_F(OomTest, AGrowableSegmentGivesBackPagesToMakeRoom) {
  CachingAllocator a(0, config(true));
  void* first = a.allocate(20 * kMiB, nullptr);
  void* second = a.allocate(20 * kMiB, nullptr);
  a.deallocate(first, 20 * kMiB, nullptr);
  // 40 MiB contiguous: not in the 20 MiB hole; 40 more pages would pass the capacity; giving
  // back the hole's pages makes room after the second block.
  void* p = a.allocate(40 * kMiB, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(a.stats().num_alloc_retries, 1u);
  EXPECT_EQ(a.stats().reserved_bytes[kAllPools].current, 60 * kMiB);
  EXPECT_EQ(a.stats().num_ooms, 0u);
  a.deallocate(p, 40 * kMiB, nullptr);
  a.deallocate(second, 20 * kMiB, nullptr);
}

TEST_F(OomTest, AnInjectedDriverFailureIsRetriedAfterReleasing) {
  CachingAllocator a(0, config(true));
  standin_.fail_alloc(1);  // the next driver allocation fails with CUDA_ERROR_OUT_OF_MEMORY
  void* p = a.allocate(8 * kMiB, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(a.stats().num_alloc_retries, 1u);
  a.deallocate(p, 8 * kMiB, nullptr);
}

TEST_F(OomTest, PendingWorkOnAnotherStreamIsWaitedForBeforeGivingUp) {
  standin_.set_bandwidth(0.02, 0.02);  // 4 MiB: 210 ms
  CachingAllocator a(0, config(true));
  driver::Stream s1;
  driver::Stream s2;
  std::vector<unsigned char> host(4 * kMiB, 1);
  void* x = a.allocate(48 * kMiB, s1.get());
  driver::copy_to_device_async(static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(x)),
                               host.data(), host.size(), s1);
  a.deallocate(x, 48 * kMiB, s1.get());
  // Stream 2 needs 48 MiB: only x can serve it, once stream 1's copy is done.
  void* y = a.allocate(48 * kMiB, s2.get());
  EXPECT_EQ(y, x);
  EXPECT_TRUE(s1.idle()) << "handed to stream 2 before stream 1's work was done";
  EXPECT_EQ(a.stats().num_ooms, 0u);
  a.deallocate(y, 48 * kMiB, s2.get());
}

TEST_F(OomTest, WhenNothingHelpsItReturnsNullAndRecordsTheState) {
  CachingAllocator a(0, config(true));
  void* live = a.allocate(60 * kMiB, nullptr);
  ASSERT_NE(live, nullptr);
  void* small_live = a.allocate(1000, nullptr);
  ASSERT_NE(small_live, nullptr);
  EXPECT_EQ(a.allocate(8 * kMiB, nullptr), nullptr);
  const std::vector<OomRecord> ooms = a.ooms();
  ASSERT_EQ(ooms.size(), 1u);
  const OomRecord& r = ooms[0];
  EXPECT_EQ(r.requested, 8 * kMiB);
  EXPECT_EQ(r.rounded, 8 * kMiB);
  EXPECT_EQ(r.allocated, 60 * kMiB + 1024);
  EXPECT_EQ(r.reserved, 62 * kMiB);
  EXPECT_EQ(r.limit, 64 * kMiB);
  EXPECT_FALSE(r.limit_reached);  // the device's capacity, not a configured limit
  EXPECT_EQ(r.device_total, 64 * kMiB);
  EXPECT_EQ(r.device_free, 2 * kMiB);
  EXPECT_NE(r.describe(0).find("out of memory on device 0"), std::string::npos);
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.num_ooms, 1u);
  EXPECT_EQ(s.allocated_bytes[kAllPools].current, 60 * kMiB + 1024);  // nothing leaked
  // The failure is on the timeline, and the allocator still works.
  EXPECT_EQ(a.timeline().back().live, 60 * kMiB + 1024);
  a.deallocate(live, 60 * kMiB, nullptr);
  void* p = a.allocate(8 * kMiB, nullptr);
  EXPECT_NE(p, nullptr);
  a.deallocate(p, 8 * kMiB, nullptr);
  a.deallocate(small_live, 1000, nullptr);
}

TEST_F(OomTest, TheSmallPoolFailsCleanlyToo) {
  CachingAllocator a(0, config(true));
  void* live = a.allocate(63 * kMiB, nullptr);  // 64 MiB of pages: the device is full
  ASSERT_NE(live, nullptr);
  EXPECT_EQ(a.allocate(1000, nullptr), nullptr);  // a small block needs a new 2 MiB segment
  ASSERT_EQ(a.ooms().size(), 1u);
  EXPECT_EQ(a.ooms()[0].rounded, 1024u);
  a.deallocate(live, 63 * kMiB, nullptr);
  void* p = a.allocate(1000, nullptr);  // the cached pages go back to make room
  EXPECT_NE(p, nullptr);
  a.deallocate(p, 1000, nullptr);
}

// Reclaimers give back one kind at a time (the executor: kept gradients, then resident state):
// bytes freed in one call need not make room for the block, so the allocator asks again, for
// what is still missing, while the allocation fails and something was freed, and records no
// out-of-memory when a later call made the room.
TEST_F(OomTest, ReclaimersAreAskedAgainWhileTheyFreeSomething) {
  CachingAllocator a(0, config(true));
  void* live = a.allocate(56 * kMiB, nullptr);
  void* useless = a.allocate(2 * kMiB, nullptr);  // freeing it leaves 4 MiB: not enough
  void* useful = a.allocate(6 * kMiB, nullptr);
  ASSERT_NE(live, nullptr);
  ASSERT_NE(useless, nullptr);
  ASSERT_NE(useful, nullptr);
  std::vector<std::uint64_t> asked;
  const std::uint64_t id = a.add_reclaimer([&](std::uint64_t bytes) -> std::uint64_t {
    asked.push_back(bytes);
    if (useless != nullptr) {
      a.deallocate(std::exchange(useless, nullptr), 2 * kMiB, nullptr);
      return 2 * kMiB;
    }
    if (useful != nullptr) {
      a.deallocate(std::exchange(useful, nullptr), 6 * kMiB, nullptr);
      return 6 * kMiB;
    }
    return 0;
  });
  void* p = a.allocate(8 * kMiB, nullptr);
  EXPECT_NE(p, nullptr);
  EXPECT_EQ(asked, (std::vector<std::uint64_t>{8 * kMiB, 6 * kMiB}));
  EXPECT_TRUE(a.ooms().empty());
  // Nothing left to give: asked once more, then the out-of-memory is recorded.
  asked.clear();
  EXPECT_EQ(a.allocate(8 * kMiB, nullptr), nullptr);
  EXPECT_EQ(asked.size(), 1u);
  EXPECT_EQ(a.ooms().size(), 1u);
  a.remove_reclaimer(id);
  a.deallocate(p, 8 * kMiB, nullptr);
  a.deallocate(live, 56 * kMiB, nullptr);
}

// Reclaimers are asked for what the limit lacks once the cache went back, not for the whole
// block: each byte of resident state they give back costs a copy home and another to return.
// Before, the executor evicted as much state as the block's size.
TEST_F(OomTest, ReclaimersAreAskedForWhatTheLimitLacks) {
  CachingAllocator a(0, config(true));
  void* live = a.allocate(56 * kMiB, nullptr);
  void* cached = a.allocate(2 * kMiB, nullptr);
  void* held = a.allocate(6 * kMiB, nullptr);
  ASSERT_NE(live, nullptr);
  ASSERT_NE(cached, nullptr);
  ASSERT_NE(held, nullptr);
  a.deallocate(cached, 2 * kMiB, nullptr);  // in the cache: given back before reclaimers
  std::vector<std::uint64_t> asked;
  const std::uint64_t id = a.add_reclaimer([&](std::uint64_t bytes) -> std::uint64_t {
    asked.push_back(bytes);
    if (held == nullptr) return 0;
    a.deallocate(std::exchange(held, nullptr), 6 * kMiB, nullptr);
    return 6 * kMiB;
  });
  void* p = a.allocate(7 * kMiB + 1000, nullptr);  // 4 pages of 2 MiB; 2 MiB of room
  EXPECT_NE(p, nullptr);
  EXPECT_EQ(asked, (std::vector<std::uint64_t>{6 * kMiB}));
  EXPECT_TRUE(a.ooms().empty());
  a.remove_reclaimer(id);
  a.deallocate(p, 7 * kMiB + 1000, nullptr);
  a.deallocate(live, 56 * kMiB, nullptr);
}

// A reclaimer that says it freed memory and never makes room is asked a bounded number of times.
TEST_F(OomTest, AReclaimerThatNeverMakesRoomIsAskedABoundedNumberOfTimes) {
  CachingAllocator a(0, config(true));
  void* live = a.allocate(60 * kMiB, nullptr);
  ASSERT_NE(live, nullptr);
  int calls = 0;
  const std::uint64_t id = a.add_reclaimer([&](std::uint64_t) -> std::uint64_t {
    ++calls;
    return kMiB;  // a claim, nothing freed
  });
  EXPECT_EQ(a.allocate(8 * kMiB, nullptr), nullptr);
  EXPECT_EQ(calls, CachingAllocator::kMaxReclaimRounds);
  EXPECT_EQ(a.ooms().size(), 1u);
  a.remove_reclaimer(id);
  a.deallocate(live, 60 * kMiB, nullptr);
}

}  // namespace
}  // namespace tide::allocator::device
