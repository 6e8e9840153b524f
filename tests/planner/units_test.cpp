#include "planner/units.h"

#include <gtest/gtest.h>

#include "config/env.h"

namespace tide::planner {
namespace {

TEST(Units, ParsesCountsOfParameters) {
  EXPECT_EQ(parse_count("--params", "20e9", 1), 20'000'000'000u);
  EXPECT_EQ(parse_count("--params", "20B", 1), 20'000'000'000u);
  EXPECT_EQ(parse_count("--params", "20G", 1), 20'000'000'000u);
  EXPECT_EQ(parse_count("--params", "100M", 1), 100'000'000u);
  EXPECT_EQ(parse_count("--params", "1.5k", 1), 1500u);
  EXPECT_EQ(parse_count("--params", "2T", 1), 2'000'000'000'000u);
  EXPECT_EQ(parse_count("--params", "12345", 1), 12345u);
  for (const char* bad : {"", "B", "0", "-5", "1.5", "20 B", "20b", "1e30", "x", "0x10", "nan"}) {
    try {
      parse_count("--params", bad, 1);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const config::EnvError& e) {
      EXPECT_NE(std::string(e.what()).find("--params=\""), std::string::npos) << e.what();
    }
  }
}

TEST(Units, FormatsForPeople) {
  EXPECT_EQ(format_sci(1e8), "1e8");
  EXPECT_EQ(format_sci(2.2e9), "2.20e9");
  EXPECT_EQ(format_sci(5.5e-3), "5.50e-3");
  EXPECT_EQ(format_sci(0), "0");
  EXPECT_EQ(format_gb(1.2e9), "1.20 GB");
}

}  // namespace
}  // namespace tide::planner
