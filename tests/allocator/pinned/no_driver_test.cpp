// Pinned arenas without a CUDA driver (TIDE_CUDA_DRIVER names a library that does not exist):
// they work on ordinary host memory and say once, on stderr, that it is not pinned.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "allocator/pinned/arena.h"

namespace tide::allocator::pinned {
namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(PinnedNoDriver, WorksUnpinnedAndSaysSoOnce) {
  ::testing::internal::CaptureStderr();
  {
    PinnedArena first;
    PinnedArena second;
    EXPECT_FALSE(first.pinned());
    for (PinnedArena* arena : {&first, &second}) {
      for (std::size_t bytes : {64ul, 100'000ul, 5'000'000ul, 40'000'000ul}) {
        auto* p = static_cast<char*>(arena->allocate(bytes));
        std::memset(p, 0x5a, bytes);
        arena->deallocate(p, bytes);
      }
      const PinnedStats s = arena->stats();
      EXPECT_EQ(s.pinned, 0u);
      EXPECT_EQ(s.register_ns, 0u);
      EXPECT_GT(s.pinned_bytes, 0u);
      EXPECT_EQ(s.requested_bytes, 0u);
    }
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(err, "NOT pinned"), 1u) << err;
  EXPECT_NE(err.find("/nonexistent/libcuda.so.1"), std::string::npos) << err;  // why
}

}  // namespace
}  // namespace tide::allocator::pinned
