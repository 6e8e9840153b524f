#include "planner/rates.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <set>
#include <string>

#include "config/env.h"
#include "config/knobs.h"

namespace tide::planner {
namespace {

class RateKnobs : public ::testing::Test {
 protected:
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  static void clear() {
    for (const RateInfo& info : rate_infos()) unsetenv(std::string(info.knob).c_str());
  }
};

TEST_F(RateKnobs, EachRateHasOneConsistentName) {
  std::set<std::string_view> keys;
  std::set<std::string_view> knobs;
  std::set<std::string_view> flags;
  for (std::size_t i = 0; i < kRateCount; ++i) {
    const RateInfo& info = rate_infos()[i];
    EXPECT_EQ(static_cast<std::size_t>(info.kind), i);
    EXPECT_TRUE(info.knob.starts_with("TIDE_RATE_")) << info.knob;
    EXPECT_TRUE(info.flag.starts_with("--")) << info.flag;
    // bytes/s in the file and GB/s on knobs and flags; params/s everywhere for updates.
    if (info.scale == 1e9) {
      EXPECT_TRUE(info.key.ends_with("_bytes_per_s")) << info.key;
      EXPECT_TRUE(info.knob.ends_with("_GBPS")) << info.knob;
      EXPECT_TRUE(info.flag.ends_with("-gbps")) << info.flag;
    } else {
      EXPECT_TRUE(info.key.ends_with("_params_per_s")) << info.key;
    }
    keys.insert(info.key);
    knobs.insert(info.knob);
    flags.insert(info.flag);
  }
  EXPECT_EQ(keys.size(), kRateCount);
  EXPECT_EQ(knobs.size(), kRateCount);
  EXPECT_EQ(flags.size(), kRateCount);
}

TEST_F(RateKnobs, EveryKnobIsRegistered) {
  std::set<std::string_view> registered;
  for (const auto& knob : config::knobs()) registered.insert(knob.name);
  for (const RateInfo& info : rate_infos()) {
    EXPECT_EQ(registered.count(info.knob), 1u) << info.knob << " is not in config/knobs.cpp";
  }
  EXPECT_EQ(registered.count("TIDE_CALIBRATION_FILE"), 1u);
}

TEST_F(RateKnobs, OverridesTheRatesThatAreSet) {
  Rates rates = builtin_rates();
  setenv("TIDE_RATE_CPU_UPDATE", "3.5e9", 1);
  setenv("TIDE_RATE_D2H_DUPLEX_GBPS", "18", 1);
  const auto overridden = apply_env_overrides(rates);
  EXPECT_EQ(rates.cpu_update, 3.5e9);
  EXPECT_EQ(rates.d2h_duplex, 18e9);
  EXPECT_EQ(rates.h2d, builtin_rates().h2d);
  EXPECT_TRUE(overridden[static_cast<std::size_t>(RateKind::cpu_update)]);
  EXPECT_TRUE(overridden[static_cast<std::size_t>(RateKind::d2h_duplex)]);
  EXPECT_FALSE(overridden[static_cast<std::size_t>(RateKind::h2d)]);
  // Empty means unset.
  setenv("TIDE_RATE_GPU_UPDATE", "", 1);
  Rates again = builtin_rates();
  apply_env_overrides(again);
  EXPECT_EQ(again.gpu_update, builtin_rates().gpu_update);
}

TEST_F(RateKnobs, EveryKnobRejectsBadValuesNamingItself) {
  for (const RateInfo& info : rate_infos()) {
    const std::string knob(info.knob);
    // Not numbers, not positive, units where a bare number is expected, and a unit mistake
    // (bytes/s given as GB/s, or params/s given in billions).
    const std::string too_big = info.scale == 1e9 ? "25e9" : "1e16";
    const std::string too_small = info.scale == 1e9 ? "1e-4" : "2.2";
    for (const std::string& bad :
         {std::string("fast"), std::string("-1"), std::string("0"), std::string("25GB/s"),
          std::string("nan"), std::string("inf"), too_big, too_small}) {
      setenv(knob.c_str(), bad.c_str(), 1);
      Rates rates = builtin_rates();
      try {
        apply_env_overrides(rates);
        ADD_FAILURE() << knob << " accepted " << bad;
      } catch (const config::EnvError& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find(knob + "=\"" + bad + "\" is not valid"), std::string::npos)
            << message;
        EXPECT_NE(message.find("a number from"), std::string::npos) << message;
      }
    }
    unsetenv(knob.c_str());
  }
}

// Host memory bandwidth, in GB/s like the copies: per rank, alone and with copies running.
TEST_F(RateKnobs, HostMemoryKnobsTakeGigabytesPerSecond) {
  Rates rates = builtin_rates();
  EXPECT_EQ(rates.host_memory, kBuiltinHostMemory);
  EXPECT_LE(rates.host_memory_contended, rates.host_memory);
  // A default that an H100-class node's CPU update alone (30 bytes per parameter) does not fill.
  EXPECT_GT(rates.host_memory, 30 * rates.cpu_update);
  setenv("TIDE_RATE_HOST_MEMORY_GBPS", "96", 1);
  setenv("TIDE_RATE_HOST_MEMORY_CONTENDED_GBPS", "80.5", 1);
  const auto overridden = apply_env_overrides(rates);
  EXPECT_EQ(rates.host_memory, 96e9);
  EXPECT_EQ(rates.host_memory_contended, 80.5e9);
  EXPECT_TRUE(overridden[static_cast<std::size_t>(RateKind::host_memory)]);
  EXPECT_TRUE(overridden[static_cast<std::size_t>(RateKind::host_memory_contended)]);
  setenv("TIDE_RATE_HOST_MEMORY_GBPS", "96e9", 1);  // bytes/s where GB/s are expected
  Rates again = builtin_rates();
  try {
    apply_env_overrides(again);
    ADD_FAILURE() << "96e9 GB/s accepted";
  } catch (const config::EnvError& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "TIDE_RATE_HOST_MEMORY_GBPS=\"96e9\" is not valid: TIDE_RATE_HOST_MEMORY_GBPS accepts "
            "a number from 0.001"),
        std::string::npos)
        << e.what();
  }
  EXPECT_EQ(format_rate(RateKind::host_memory, 96e9), "96.0 GB/s");
}

TEST(Rates, ValidateNamesTheBadRate) {
  Rates r = builtin_rates();
  EXPECT_NO_THROW(validate(r, "here"));
  r.d2h = -3;
  try {
    validate(r, "here");
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("here: rate d2h_bytes_per_s"), std::string::npos)
        << e.what();
  }
}

TEST(Rates, FormatsForPeople) {
  EXPECT_EQ(format_rate(RateKind::cpu_update, 2.2e9), "2.20e9 params/s");
  EXPECT_EQ(format_rate(RateKind::h2d, 25e9), "25.0 GB/s");
}

}  // namespace
}  // namespace tide::planner
