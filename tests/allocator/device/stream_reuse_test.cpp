// Stream-ordered reuse: a block freed on stream A is reused at once on A, and on another stream
// only once A's work submitted before the free has completed; record_stream adds streams to wait
// for. The stand-in's simulated copy bandwidth keeps A busy long enough to tell.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "allocator/device/caching_allocator.h"
#include "driver/context.h"
#include "driver/memory.h"
#include "driver/stream.h"
#include "tests/allocator/device_standin.h"

namespace tide::allocator::device {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

CUdeviceptr dev(void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)); }

class StreamReuseTest : public ::testing::TestWithParam<std::size_t> {
 protected:
  // 20 MB/s: a 4 MiB copy takes 210 ms, long enough to still run however loaded the machine.
  void SetUp() override { standin_.set_bandwidth(0.02, 0.02); }
  void TearDown() override { standin_.set_bandwidth(0, 0); }

  static AllocatorConfig config(std::size_t thread_cache) {
    AllocatorConfig c;
    c.thread_cache_bytes = thread_cache;
    return c;
  }
  // Slow work on `stream` that ends by writing `ptr`: a 4 MiB host-to-device copy (from pinned
  // memory, so that it is truly asynchronous), then a small copy into the block.
  void busy(const driver::Stream& stream, void* ptr) {
    driver::copy_to_device_async(scratch_.get(), host_.data(), host_.size(), stream);
    driver::copy_to_device_async(dev(ptr), host_.data(), 4096, stream);
  }

  driver::CurrentContext context_{0};
  testing::DeviceStandin standin_;
  std::vector<unsigned char> host_ = std::vector<unsigned char>(4 * kMiB, 7);
  driver::HostRegistration pinned_{host_.data(), host_.size()};
  driver::DeviceBuffer scratch_{4 * kMiB};
};

// Sizes: a small-pool block (through the thread cache when it is on) and a large-pool one, each
// as large as its pool's fresh memory allows, so that a freed block is the only one that fits.
TEST_P(StreamReuseTest, ABlockFreedOnABusyStreamIsNotHandedToAnother) {
  const std::size_t size = GetParam();
  for (std::size_t cache : {std::size_t{0}, 4 * kMiB}) {
    CachingAllocator a(0, config(cache));
    driver::Stream s1;
    driver::Stream s2;
    void* x = a.allocate(size, s1.get());
    busy(s1, x);
    a.deallocate(x, size, s1.get());
    ASSERT_FALSE(s1.idle()) << "the copy should still run";
    // On its own stream it is reused at once (it is the only free block that fits): stream
    // order covers it.
    void* z = a.allocate(size, s1.get());
    EXPECT_EQ(z, x) << "thread cache bytes " << cache;
    EXPECT_FALSE(s1.idle());
    a.deallocate(z, size, s1.get());
    void* y = a.allocate(size, s2.get());
    // The property itself: if the block comes back on s2, s1's work must be done by now.
    if (y == x) {
      EXPECT_TRUE(s1.idle()) << "block handed to stream 2 while stream 1 still used it";
    }
    EXPECT_NE(y, x) << "thread cache bytes " << cache;
    a.deallocate(y, size, s2.get());
    s1.synchronize();
    s2.synchronize();
  }
}

TEST_P(StreamReuseTest, ABlockIsReusedOnAnotherStreamOnceItsWorkIsDone) {
  const std::size_t size = GetParam();
  CachingAllocator a(0, config(0));
  driver::Stream s1;
  driver::Stream s2;
  void* x = a.allocate(size, s1.get());
  busy(s1, x);
  a.deallocate(x, size, s1.get());
  void* y = a.allocate(size, s2.get());  // a different block: s1 is busy
  ASSERT_NE(y, x);
  // y's new 2 MiB small segment has room for one more: take it, so that only x can serve the
  // next request. (A large block gets exactly its pages: no room left.)
  std::vector<void*> fill;
  if (size <= kMiB) fill.push_back(a.allocate(size, s2.get()));
  for (void* f : fill) ASSERT_NE(f, x);
  s1.synchronize();
  void* w = a.allocate(size, s2.get());  // s1's fence has completed: x is free for anyone
  EXPECT_EQ(w, x);
  a.deallocate(w, size, s2.get());
  a.deallocate(y, size, s2.get());
  for (void* f : fill) a.deallocate(f, size, s2.get());
}

TEST_P(StreamReuseTest, RecordStreamDelaysReuseUntilTheOtherStreamIsDone) {
  const std::size_t size = GetParam();
  for (std::size_t cache : {std::size_t{0}, 4 * kMiB}) {
    CachingAllocator a(0, config(cache));
    driver::Stream s1;
    driver::Stream s2;
    void* x = a.allocate(size, s1.get());
    busy(s2, x);  // stream 2 uses the block
    a.record_stream(x, s2.get());
    a.deallocate(x, size, s1.get());
    EXPECT_EQ(a.stats().active_bytes[kAllPools].current, a.round_size(size));  // pending
    void* y = a.allocate(size, s1.get());
    if (y == x) {
      EXPECT_TRUE(s2.idle()) << "block reused while a recorded stream still used it";
    }
    EXPECT_NE(y, x);
    s2.synchronize();
    void* w = a.allocate(size, s1.get());  // the event on stream 2 has completed
    EXPECT_EQ(w, x);
    a.deallocate(w, size, s1.get());
    a.deallocate(y, size, s1.get());
    EXPECT_EQ(a.stats().active_bytes[kAllPools].current, 0u);
  }
}

// A holder that waits for its own stream (tide's executor after its phase) hands what it freed
// there to any stream at once (streams_waited); what it frees after reading frees_so_far() still
// waits for that stream's work.
TEST_P(StreamReuseTest, BlocksFreedBeforeTheHolderWaitedServeAnyStreamAndNoLaterOnes) {
  const std::size_t size = GetParam();
  CachingAllocator a(0, config(0));
  driver::Stream s1;
  driver::Stream s2;
  void* x = a.allocate(size, s1.get());
  void* v = a.allocate(size, s1.get());
  busy(s1, x);
  a.deallocate(x, size, s1.get());
  const std::uint64_t frees = a.frees_so_far();
  s1.synchronize();
  a.streams_waited(s1.get(), frees);
  void* y = a.allocate(size, s2.get());
  EXPECT_EQ(y, x);
  busy(s1, v);
  a.deallocate(v, size, s1.get());
  a.streams_waited(s1.get(), frees);  // covers x only
  ASSERT_FALSE(s1.idle()) << "the copy should still run";
  void* w = a.allocate(size, s2.get());
  if (w == v) {
    EXPECT_TRUE(s1.idle()) << "a block freed after frees_so_far() went to stream 2 while busy";
  }
  EXPECT_NE(w, v);
  a.deallocate(w, size, s2.get());
  a.deallocate(y, size, s2.get());
  s1.synchronize();
}

std::string size_name(const ::testing::TestParamInfo<std::size_t>& p) {
  return p.param <= kMiB ? "small" : "large";
}
INSTANTIATE_TEST_SUITE_P(Sizes, StreamReuseTest, ::testing::Values(kMiB, 4 * kMiB), size_name);

}  // namespace
}  // namespace tide::allocator::device
