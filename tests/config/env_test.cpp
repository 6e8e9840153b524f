#include "config/env.h"
#include "config/placement.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

namespace tide::config {
namespace {

TEST(ParseBytes, AcceptsUnitsAndPlainNumbers) {
  EXPECT_EQ(parse_bytes("X", "4096"), 4096u);
  EXPECT_EQ(parse_bytes("X", "8GiB"), 8ull << 30);
  EXPECT_EQ(parse_bytes("X", "8gib"), 8ull << 30);
  EXPECT_EQ(parse_bytes("X", "512MiB"), 512ull << 20);
  EXPECT_EQ(parse_bytes("X", "1.5GB"), 1500000000ull);
  EXPECT_EQ(parse_bytes("X", "2K"), 2048u);
  EXPECT_EQ(parse_bytes("X", " 3 MB "), 3000000u);
  EXPECT_EQ(parse_bytes("X", "0"), 0u);
}

TEST(ParseBytes, RejectsWhatIsNotASize) {
  for (const char* bad :
       {"", "GiB", "-1", "1.5", "1.5B", "8 GiBs", "1e3", "0x10", "abc", "1..2", "99999999999TiB"}) {
    EXPECT_THROW(parse_bytes("TIDE_TEST_SIZE", bad), EnvError) << bad;
  }
}

TEST(ParseBytes, ErrorNamesTheVariableTheValueAndWhatItAccepts) {
  try {
    parse_bytes("TIDE_STANDIN_MEMORY", "lots");
    FAIL() << "no error";
  } catch (const EnvError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("TIDE_STANDIN_MEMORY"), std::string::npos) << message;
    EXPECT_NE(message.find("\"lots\""), std::string::npos) << message;
    EXPECT_NE(message.find("GiB"), std::string::npos) << message;
  }
}

TEST(ParseBool, AcceptsTheUsualSpellingsOnly) {
  for (const char* yes : {"1", "true", "TRUE", "yes", "on"}) EXPECT_TRUE(parse_bool("X", yes));
  for (const char* no : {"0", "false", "No", "off"}) EXPECT_FALSE(parse_bool("X", no));
  for (const char* bad : {"", "2", "y", "enable", "truee"}) {
    EXPECT_THROW(parse_bool("X", bad), EnvError) << bad;
  }
}

TEST(ParseInt, ChecksRangeAndSyntax) {
  EXPECT_EQ(parse_int("X", "7", 1, 10), 7);
  EXPECT_EQ(parse_int("X", "-3", -5, 0), -3);
  for (const char* bad : {"", "0", "11", "3.0", "3x", "x3", " "}) {
    EXPECT_THROW(parse_int("X", bad, 1, 10), EnvError) << bad;
  }
  try {
    parse_int("TIDE_CPU_THREADS", "0", 1, 256);
    FAIL() << "no error";
  } catch (const EnvError& e) {
    EXPECT_NE(std::string(e.what()).find("from 1 to 256"), std::string::npos) << e.what();
  }
}

TEST(ParseDouble, ChecksRangeAndSyntax) {
  EXPECT_DOUBLE_EQ(parse_double("X", "2.5", 0, 10), 2.5);
  EXPECT_DOUBLE_EQ(parse_double("X", "1e1", 0, 10), 10.0);
  for (const char* bad : {"", "-1", "11", "nan", "inf", "2.5GB"}) {
    EXPECT_THROW(parse_double("X", bad, 0, 10), EnvError) << bad;
  }
}

TEST(ParseChoice, ReturnsTheIndexOrListsTheChoices) {
  EXPECT_EQ(parse_choice("X", "gpu", {"auto", "cpu", "gpu"}), 2u);
  try {
    parse_choice("TIDE_PLACEMENT", "GPU", {"auto", "cpu", "gpu"});
    FAIL() << "no error";
  } catch (const EnvError& e) {
    EXPECT_NE(std::string(e.what()).find("one of: auto cpu gpu"), std::string::npos) << e.what();
  }
}

TEST(Env, UnsetAndEmptyMeanNotGiven) {
  unsetenv("TIDE_TEST_KNOB");
  EXPECT_FALSE(env_bytes("TIDE_TEST_KNOB").has_value());
  setenv("TIDE_TEST_KNOB", "", 1);
  EXPECT_FALSE(env_bytes("TIDE_TEST_KNOB").has_value());
  setenv("TIDE_TEST_KNOB", "1MiB", 1);
  EXPECT_EQ(env_bytes("TIDE_TEST_KNOB"), 1u << 20);
  setenv("TIDE_TEST_KNOB", "lots", 1);
  EXPECT_THROW(env_bytes("TIDE_TEST_KNOB"), EnvError);
  unsetenv("TIDE_TEST_KNOB");
}

}  // namespace
}  // namespace tide::config

namespace tide::config {
namespace {

// The one grammar of a placement (config/placement.h): the knob's check and the executor's policy.
TEST(Placement, NamesAndKsParseAndEverythingElseDoesNot) {
  EXPECT_EQ(parse_placement("auto")->kind, Placement::Kind::automatic);
  EXPECT_EQ(parse_placement("cpu")->kind, Placement::Kind::cpu);
  EXPECT_EQ(parse_placement("gpu")->kind, Placement::Kind::gpu);
  for (const char* two : {"2", "k2", "K2"}) {
    ASSERT_TRUE(parse_placement(two).has_value()) << two;
    EXPECT_EQ(parse_placement(two)->kind, Placement::Kind::interleave);
    EXPECT_EQ(parse_placement(two)->k, 2u);
  }
  EXPECT_EQ(parse_placement("1073741824")->k, std::size_t{1} << 30);
  for (const char* bad : {"", "0", "k", "k0", "-1", "1073741825", "Auto", "2x", " 2", "gpu "}) {
    EXPECT_FALSE(parse_placement(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace tide::config
