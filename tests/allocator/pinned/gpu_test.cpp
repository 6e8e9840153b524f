// Copies between pinned arena memory and the device, asynchronous, both ways.
//
// Built twice: pinned_gpu_standin_test runs against the host stand-in driver (which also counts
// async copies whose host side was not page-locked: there must be none); pinned_gpu_test (label
// `gpu`, TIDE_REAL_GPU) against the real driver, and exits 77 (skipped) without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "allocator/pinned/arena.h"
#include "driver/context.h"
#include "driver/memory.h"
#include "driver/stream.h"
#include "tests/gpu_test_support.h"
#if !defined(TIDE_REAL_GPU)
#include "tests/allocator/device_standin.h"
#endif

namespace tide::allocator::pinned {
namespace {

TEST(PinnedGpu, AsyncCopiesRoundTripThroughPinnedBuffers) {
#if !defined(TIDE_REAL_GPU)
  const testing::DeviceStandin standin;
  const std::uint64_t pageable_before = standin.stats().pageable_async_copies;
#endif
  PinnedArena arena;
  ASSERT_TRUE(arena.pinned());
  const driver::CurrentContext context(0);
  const driver::Stream stream;
  // A subgroup's three fp32 buffers (1e7 parameters each), and small ones through jemalloc.
  for (std::size_t bytes : {std::size_t{40'000'000}, std::size_t{40'000'000}, std::size_t{4096},
                            std::size_t{100'000}}) {
    auto* src = static_cast<unsigned char*>(arena.allocate(bytes));
    auto* dst = static_cast<unsigned char*>(arena.allocate(bytes));
    for (std::size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>(i * 31 + 7);
    std::memset(dst, 0, bytes);
    const driver::DeviceBuffer device(bytes);
    driver::copy_to_device_async(device.get(), src, bytes, stream);
    driver::copy_to_host_async(dst, device.get(), bytes, stream);
    stream.synchronize();
    EXPECT_EQ(std::memcmp(src, dst, bytes), 0) << bytes << " bytes";
    arena.deallocate(src, bytes);
    arena.deallocate(dst, bytes);
  }
  const PinnedStats s = arena.stats();
  EXPECT_GT(s.register_ns, 0u);
  EXPECT_EQ(s.unregister_failures, 0u);
#if !defined(TIDE_REAL_GPU)
  EXPECT_EQ(standin.stats().pageable_async_copies, pageable_before);
#endif
}

TEST(PinnedGpu, ChunksRegisterAndUnregisterOnThreadsWithoutAContext) {
  // Neither thread has a current context: the arena brings its own for each driver call.
  std::unique_ptr<PinnedArena> arena;
  std::thread([&] {
    arena = std::make_unique<PinnedArena>();
    arena->deallocate(arena->allocate(50'000'000), 50'000'000);
  }).join();
  std::thread([&] {
    EXPECT_EQ(arena->stats().unregister_failures, 0u);
    arena.reset();
  }).join();
}

}  // namespace
}  // namespace tide::allocator::pinned
