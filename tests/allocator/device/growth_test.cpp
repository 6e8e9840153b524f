// How the growable segment grows and gives memory back: in steps that grow with it (few driver
// mappings while a workload climbs), never past the limit or the device's free memory, and in
// pieces no larger than the room near the limit leaves (2 MiB pages there).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "allocator/device/caching_allocator.h"
#include "allocator/device/config.h"
#include "driver/context.h"
#include "driver/memory.h"
#include "tests/allocator/device_standin.h"

namespace tide::allocator::device {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kPage = 2 * kMiB;

class GrowthTest : public ::testing::Test {
 protected:
  static AllocatorConfig config(std::optional<std::uint64_t> max_bytes = std::nullopt) {
    AllocatorConfig c;
    c.growable = true;
    c.thread_cache_bytes = 0;
    c.max_bytes = max_bytes;
    return c;
  }
  void TearDown() override { standin_.set_capacity(capacity_); }

  driver::CurrentContext context_{0};
  testing::DeviceStandin standin_;
  const std::uint64_t capacity_ = standin_.capacity();
};

// Blocks of 1.5 to 4 MiB, one after the other, none freed: a forward pass's activations.
std::vector<std::size_t> climbing_sizes(int count) {
  std::vector<std::size_t> sizes;
  for (int i = 0; i < count; ++i) {
    sizes.push_back(3 * kMiB / 2 + static_cast<std::size_t>(i % 6) * kMiB / 2);
  }
  return sizes;
}

TEST_F(GrowthTest, AClimbingWorkloadMapsFarFewerTimesThanPages) {
  standin_.set_capacity(std::uint64_t{8} << 30);
  CachingAllocator a(0, config());
  std::vector<std::pair<void*, std::size_t>> blocks;
  std::uint64_t bytes = 0;
  for (std::size_t size : climbing_sizes(600)) {
    blocks.emplace_back(a.allocate(size, nullptr), size);
    ASSERT_NE(blocks.back().first, nullptr);
    bytes += size;
  }
  const AllocatorStats s = a.stats();
  const std::uint64_t pages = (bytes + kPage - 1) / kPage;  // 825
  // Page by page: one mapping per page. In steps of an eighth of what is mapped (up to 64 MiB):
  // a few dozen.
  EXPECT_LT(s.num_device_alloc * 8, pages)
      << s.num_device_alloc << " mappings for " << pages << " pages";
  EXPECT_EQ(standin_.stats().mem_creates, s.num_device_alloc);
  // What it reserves beyond the pages the blocks need: at most one step (an eighth, 64 MiB).
  EXPECT_GE(s.reserved_bytes[kAllPools].peak, pages * kPage);
  EXPECT_LE(s.reserved_bytes[kAllPools].peak,
            pages * kPage + std::min(pages * kPage / 8, 64 * kMiB));
  for (auto [p, size] : blocks) a.deallocate(p, size, nullptr);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes[kAllPools].current, 0u);
  EXPECT_EQ(a.stats().num_device_free, s.num_device_alloc);
}

// 3 MiB blocks until the allocator refuses: it stops exactly where page-by-page growth stopped.
std::vector<void*> fill(CachingAllocator& a) {
  std::vector<void*> blocks;
  while (void* p = a.allocate(3 * kMiB, nullptr)) blocks.push_back(p);
  return blocks;
}

TEST_F(GrowthTest, TheLimitIsStillExact) {
  standin_.set_capacity(std::uint64_t{2} << 30);
  CachingAllocator a(0, config(1025 * kMiB));  // TIDE_ALLOC_MAX_BYTES=1025MiB: 512 pages
  const std::vector<void*> blocks = fill(a);
  const AllocatorStats s = a.stats();
  EXPECT_EQ(blocks.size(), 341u);  // 1023 MiB: 342 would need 513 pages
  EXPECT_EQ(s.reserved_bytes[kAllPools].peak, 1024 * kMiB);
  EXPECT_LT(s.num_device_alloc * 4, 512u);  // not one per page
  EXPECT_EQ(s.num_ooms, 1u);
  for (void* p : blocks) a.deallocate(p, 3 * kMiB, nullptr);
}

TEST_F(GrowthTest, AStepTheDeviceHasNoRoomForFallsBackToWhatFits) {
  standin_.set_capacity(128 * kMiB);
  driver::DeviceBuffer other(28 * kMiB);  // another user of the device: 100 MiB left
  CachingAllocator a(0, config());        // its limit: the device's 128 MiB
  const std::vector<void*> blocks = fill(a);
  const AllocatorStats s = a.stats();
  EXPECT_EQ(blocks.size(), 33u);
  EXPECT_EQ(s.reserved_bytes[kAllPools].current, 100 * kMiB);
  EXPECT_EQ(standin_.bytes_in_use(), 128 * kMiB);
  for (void* p : blocks) a.deallocate(p, 3 * kMiB, nullptr);
}

TEST_F(GrowthTest, NearTheLimitMemoryIsMappedAndGivenBackInPages) {
  standin_.set_capacity(std::uint64_t{1} << 30);
  CachingAllocator a(0, config(64 * kMiB));
  void* big = a.allocate(48 * kMiB, nullptr);  // pieces of 4 MiB (a sixteenth of the limit)
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(a.stats().num_device_alloc, 12u);
  // 16 MiB of room left: pieces of 2 MiB.
  std::vector<void*> pages;
  for (int i = 0; i < 8; ++i) pages.push_back(a.allocate(kPage, nullptr));
  for (void* p : pages) ASSERT_NE(p, nullptr);
  EXPECT_EQ(a.stats().reserved_bytes[kAllPools].current, 64 * kMiB);
  EXPECT_EQ(a.stats().num_device_alloc, 20u);
  // Every other page freed: each goes back on its own.
  for (std::size_t i = 0; i < pages.size(); i += 2) a.deallocate(pages[i], kPage, nullptr);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes[kAllPools].current, 56 * kMiB);
  EXPECT_EQ(a.stats().num_device_free, 4u);
  // A block that frees part of a piece gives back the piece once all of it is free.
  a.deallocate(big, 48 * kMiB, nullptr);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes[kAllPools].current, 8 * kMiB);
  for (std::size_t i = 1; i < pages.size(); i += 2) a.deallocate(pages[i], kPage, nullptr);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes[kAllPools].current, 0u);
  EXPECT_EQ(a.stats().num_device_free, a.stats().num_device_alloc);
}

TEST_F(GrowthTest, APieceHalfHeldByALiveBlockStaysUntilItIsFree) {
  standin_.set_capacity(std::uint64_t{1} << 30);
  CachingAllocator a(0, config(std::uint64_t{1} << 30));
  void* first = a.allocate(100 * kMiB, nullptr);  // pieces of 64 MiB and 36 MiB
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(a.stats().num_device_alloc, 2u);
  a.deallocate(first, 100 * kMiB, nullptr);
  void* low = a.allocate(32 * kMiB, nullptr);  // in the first piece
  ASSERT_EQ(low, first);
  a.empty_cache();
  // The second piece was free; the first holds the live block.
  EXPECT_EQ(a.stats().reserved_bytes[kAllPools].current, 64 * kMiB);
  a.deallocate(low, 32 * kMiB, nullptr);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes[kAllPools].current, 0u);
}

}  // namespace
}  // namespace tide::allocator::device
