#include "config/bytes.h"

#include <gtest/gtest.h>

#include "config/env.h"

namespace tide::config {
namespace {

TEST(FormatBytes, PicksTheUnitThatFitsWithThreeSignificantDigits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(640 * 1024), "640 KiB");
  EXPECT_EQ(format_bytes(3 * 1024 * 1024 / 2), "1.50 MiB");
  EXPECT_EQ(format_bytes(std::uint64_t{12} << 30 | std::uint64_t{300} << 20), "12.3 GiB");
  EXPECT_EQ(format_bytes(std::uint64_t{5} << 40), "5.00 TiB");
}

TEST(FormatBytes, SmallSizesDoNotRoundToZero) {
  // What a 1 MiB TIDE_NODE_PINNED_LIMIT message showed as "0.00 GiB".
  EXPECT_EQ(format_bytes(1 << 20), "1.00 MiB");
  EXPECT_EQ(format_bytes(4096), "4.00 KiB");
}

TEST(FormatBytes, ReadsBackAsTheSizeWithinItsDigits) {
  // What a message shows is what TIDE_* accepts, give or take the last digit.
  for (std::uint64_t b : {std::uint64_t{1536}, std::uint64_t{3} << 29, std::uint64_t{7} << 33}) {
    std::string text = format_bytes(b);
    text.erase(text.find(' '), 1);
    const double back = static_cast<double>(parse_bytes("X", text));
    EXPECT_NEAR(back, static_cast<double>(b), static_cast<double>(b) * 0.005) << text;
  }
}

TEST(FormatBytesApart, AddsDigitsUntilDifferentSizesReadDifferently) {
  const auto out = format_bytes_apart({1 << 20, (1 << 20) + 4096, 1 << 20});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_NE(out[0], out[1]);
  EXPECT_EQ(out[0], out[2]);  // equal sizes read equal
  EXPECT_EQ(out[1], "1.004 MiB");
}

TEST(FormatBytesApart, KeepsThreeDigitsWhenTheyDiffer) {
  const auto out = format_bytes_apart({1 << 20, 3 << 29});
  EXPECT_EQ(out[0], "1.00 MiB");
  EXPECT_EQ(out[1], "1.50 GiB");
}

TEST(FormatBytesApart, SizesOneByteApartStillDiffer) {
  const std::uint64_t big = (std::uint64_t{1} << 40) + 1;
  const auto out = format_bytes_apart({big, big - 1});
  EXPECT_NE(out[0], out[1]);
}

}  // namespace
}  // namespace tide::config
