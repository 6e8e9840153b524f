#include "planner/calibration_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "config/env.h"
#include "io/safe_file.h"
#include "planner/node_rates.h"
#include "planner/rate_sources.h"

namespace tide::planner {
namespace {

namespace fs = std::filesystem;

// A fresh folder per test, removed after; the calibration variables cleared around each test.
// The example of calibration_file.h, comments removed.
constexpr const char* kDocumented = R"({
  "format": "tide-calibration",
  "version": 1,
  "measured_at": "2025-01-31T12:00:00Z",
  "machine": {
    "hostname": "node17",
    "cpu_model": "AMD EPYC 9654 96-Core Processor",
    "cpu_threads": 24,
    "gpu_name": "NVIDIA H100 80GB HBM3",
    "gpu_memory_bytes": 85520809984,
    "ranks_per_host": 4
  },
  "rates": {
    "cpu_update_params_per_s": 2.2e9,
    "cpu_update_contended_params_per_s": 2.0e9,
    "h2d_bytes_per_s": 25e9,
    "d2h_bytes_per_s": 25e9,
    "h2d_duplex_bytes_per_s": 23e9,
    "d2h_duplex_bytes_per_s": 23e9,
    "gpu_update_params_per_s": 5e10,
    "host_memory_bytes_per_s": 1.2e11,
    "host_memory_contended_bytes_per_s": 1.1e11
  }
})";

// A file written before the host memory rates: the documented one without them.
std::string without_host_memory() {
  std::string text = kDocumented;
  const auto cut = text.find(",\n    \"host_memory_bytes_per_s\"");
  const auto end = text.find("\n  }", cut);
  return text.erase(cut, end - cut);
}

class CalibrationFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tide_calibration_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* name : kVariables) {
      if (const char* v = std::getenv(name)) saved_.emplace_back(name, v);
      unsetenv(name);
    }
    setenv("XDG_CACHE_HOME", (dir_ / "cache").c_str(), 1);
  }
  void TearDown() override {
    for (const char* name : kVariables) unsetenv(name);
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
    fs::remove_all(dir_);
  }
  fs::path write(const std::string& name, const std::string& text) {
    fs::path path = dir_ / name;
    std::ofstream(path) << text;
    return path;
  }
  // The documented file with "member": value added: loading it must fail, naming the file and
  // saying `where`.
  void expect_member_refused(const std::string& member, const std::string& value,
                             const std::string& where) {
    std::string text = kDocumented;
    text.erase(text.rfind('}'));
    const fs::path path = write("bad.json", text + ", \"" + member + "\": " + value + "}");
    try {
      load_calibration(path);
      ADD_FAILURE() << member << ": " << value << " accepted";
    } catch (const CalibrationError& e) {
      EXPECT_NE(std::string(e.what()).find("calibration " + path.string() + ": " + where),
                std::string::npos)
          << e.what();
    }
  }

  static constexpr const char* kVariables[] = {"TIDE_CALIBRATION_FILE", "XDG_CACHE_HOME", "HOME",
                                               "TIDE_RATE_CPU_UPDATE", "TIDE_RATE_H2D_GBPS"};
  fs::path dir_;
  std::vector<std::pair<std::string, std::string>> saved_;
};

Calibration sample() {
  Calibration c;
  c.machine.hostname = "node17";
  c.machine.cpu_model = "AMD EPYC 9654 \"96-Core\" Processor";
  c.machine.cpu_threads = 24;
  c.machine.gpu_name = "NVIDIA H100 80GB HBM3";
  c.machine.gpu_memory_bytes = 85'520'809'984;
  c.machine.ranks_per_host = 4;
  c.measured_at = "2025-01-31T12:00:00Z";
  c.rates = builtin_rates();
  c.rates.cpu_update = 2.123456789012345e9;  // full precision survives the round trip
  return c;
}

TEST_F(CalibrationFile, TheDocumentedExampleParses) {
  const Calibration c = parse_calibration(kDocumented, "doc");
  EXPECT_EQ(c.rates, builtin_rates());
  EXPECT_EQ(c.machine.hostname, "node17");
  EXPECT_EQ(c.machine.cpu_threads, 24);
  EXPECT_EQ(c.machine.ranks_per_host, 4);
  EXPECT_EQ(c.machine.gpu_memory_bytes, 85'520'809'984u);
}

TEST_F(CalibrationFile, RoundTripsThroughTextAndDisk) {
  const Calibration c = sample();
  EXPECT_EQ(parse_calibration(format_calibration(c), "text"), c);
  const fs::path path = dir_ / "deeper" / "calibration.json";
  save_calibration(path, c);
  EXPECT_EQ(load_calibration(path), c);
  // Saving again replaces it and leaves no temporary file behind.
  Calibration changed = c;
  changed.rates.h2d = 30e9;
  save_calibration(path, changed);
  EXPECT_EQ(load_calibration(path), changed);
  EXPECT_EQ(std::distance(fs::directory_iterator(path.parent_path()), fs::directory_iterator()), 1);
}

// The host memory rates round trip; a file from before them loads with the built-in ones, and
// resolve_rates says they are the built-in defaults, not the file's.
TEST_F(CalibrationFile, HostMemoryRatesRoundTripAndOldFilesLoad) {
  Calibration c = sample();
  c.rates.host_memory = 96e9;
  c.rates.host_memory_contended = 71.5e9;
  const std::string text = format_calibration(c);
  EXPECT_NE(text.find("\"host_memory_bytes_per_s\": 96000000000"), std::string::npos) << text;
  EXPECT_NE(text.find("\"host_memory_contended_bytes_per_s\": 71500000000"), std::string::npos)
      << text;
  EXPECT_EQ(parse_calibration(text, "text"), c);
  save_calibration(dir_ / "new.json", c);
  const ResolvedRates fresh = resolve_rates(dir_ / "new.json");
  EXPECT_EQ(fresh.rates.host_memory, 96e9);
  EXPECT_EQ(fresh.source[static_cast<std::size_t>(RateKind::host_memory)], RateSource::calibration);

  const std::string old = without_host_memory();
  ASSERT_EQ(old.find("host_memory"), std::string::npos) << old;
  const Calibration loaded = parse_calibration(old, "old");
  EXPECT_EQ(loaded.rates, builtin_rates());
  EXPECT_TRUE(loaded.rate_missing[static_cast<std::size_t>(RateKind::host_memory)]);
  EXPECT_FALSE(loaded.rate_missing[static_cast<std::size_t>(RateKind::h2d)]);
  const ResolvedRates r = resolve_rates(write("old.json", old));
  EXPECT_EQ(r.rates.host_memory_contended, builtin_rates().host_memory_contended);
  EXPECT_EQ(r.source[static_cast<std::size_t>(RateKind::host_memory_contended)],
            RateSource::builtin);
  EXPECT_EQ(r.source[static_cast<std::size_t>(RateKind::cpu_update)], RateSource::calibration);
  // Written again, the file has them.
  Calibration rewritten = loaded;
  rewritten.rate_missing = {};
  EXPECT_NE(format_calibration(rewritten).find("host_memory_bytes_per_s"), std::string::npos);
  // The rates that were always there are still required, and a bad host memory rate is refused.
  std::string no_h2d = old;
  no_h2d.erase(no_h2d.find("\"h2d_bytes_per_s\": 25e9,"), 25);
  EXPECT_THROW(parse_calibration(no_h2d, "old"), CalibrationError);
  std::string bad = kDocumented;
  bad.replace(bad.find("1.2e11"), 6, "-1");
  try {
    parse_calibration(bad, "bad");
    ADD_FAILURE() << "a negative host memory rate accepted";
  } catch (const CalibrationError& e) {
    EXPECT_NE(std::string(e.what()).find("rates.host_memory_bytes_per_s"), std::string::npos)
        << e.what();
  }
}

TEST_F(CalibrationFile, OptionalMembersMayBeLeftOut) {
  Calibration c;
  c.machine.hostname = "h";
  c.machine.cpu_threads = 1;
  c.rates = builtin_rates();
  const std::string text = format_calibration(c);
  EXPECT_EQ(text.find("gpu_name"), std::string::npos);
  EXPECT_EQ(parse_calibration(text, "text"), c);
}

// Each malformed text must fail with a message that contains `where` (what is wrong, where).
TEST_F(CalibrationFile, RejectsMalformedFiles) {
  const std::string good = kDocumented;
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const auto at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "not valid JSON: line 1, column 1"},
      {"{", "not valid JSON"},
      {"[]", "the top level: must be an object"},
      {good + "x", "unexpected text after the JSON value"},
      {replaced("\"version\": 1,", "\"version\": 1,,"), "line 3"},
      {replaced("tide-calibration", "tide-calibratio"), "format: must be \"tide-calibration\""},
      {replaced("\"version\": 1", "\"version\": 2"), "version: this tide reads version 1"},
      {replaced("\"version\": 1,", ""), "version: missing"},
      {replaced("\"h2d_bytes_per_s\": 25e9,", ""), "rates.h2d_bytes_per_s: missing"},
      {replaced("\"h2d_bytes_per_s\"", "\"h2d_bytes_per_sec\""), "rates.h2d_bytes_per_s: missing"},
      {replaced("\"h2d_bytes_per_s\": 25e9,", "\"h2d_bytes_per_s\": 25e9, \"h2d_gbps\": 25,"),
       "unknown member \"h2d_gbps\""},
      {replaced("25e9,\n    \"d2h_bytes", "-25e9,\n    \"d2h_bytes"),
       "rates.h2d_bytes_per_s: must be a number > 0"},
      {replaced("25e9,\n    \"d2h_bytes", "0,\n    \"d2h_bytes"),
       "rates.h2d_bytes_per_s: must be a number > 0"},
      {replaced("25e9,\n    \"d2h_bytes", "\"25e9\",\n    \"d2h_bytes"),
       "rates.h2d_bytes_per_s: must be a number > 0"},
      {replaced("25e9,\n    \"d2h_bytes", "1e999,\n    \"d2h_bytes"), "number out of range"},
      {replaced("25e9,\n    \"d2h_bytes", "NaN,\n    \"d2h_bytes"), "expected a JSON value"},
      {replaced("\"cpu_threads\": 24", "\"cpu_threads\": 0"),
       "machine.cpu_threads: must be a whole number"},
      {replaced("\"cpu_threads\": 24", "\"cpu_threads\": 2.5"),
       "machine.cpu_threads: must be a whole number"},
      {replaced("\"hostname\": \"node17\"", "\"hostname\": 17"),
       "machine.hostname: must be a string"},
      {replaced("\"hostname\": \"node17\",", ""), "machine.hostname: missing"},
      {replaced("\"ranks_per_host\": 4", "\"ranks_per_host\": 4, \"ranks_per_host\": 2"),
       "duplicate member \"ranks_per_host\""},
      {replaced("\"ranks_per_host\": 4", "\"rank_per_host\": 4"),
       "unknown member \"rank_per_host\""},
      {replaced("\"machine\": {", "\"machine\": [{"), "expected ',' or ']'"},
  };
  for (const auto& [text, where] : cases) {
    try {
      parse_calibration(text, "/some/file.json");
      ADD_FAILURE() << "accepted:\n" << text;
    } catch (const CalibrationError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("calibration /some/file.json: "), std::string::npos) << message;
      EXPECT_NE(message.find(where), std::string::npos) << message << "\nwanted: " << where;
    }
  }
}

TEST_F(CalibrationFile, MissingAndHugeFilesFailClearly) {
  try {
    load_calibration(dir_ / "absent.json");
    FAIL() << "no error";
  } catch (const CalibrationError& e) {
    EXPECT_NE(std::string(e.what()).find("absent.json: cannot be read"), std::string::npos)
        << e.what();
  }
  const fs::path big = write("big.json", std::string(2 << 20, ' '));
  EXPECT_THROW(load_calibration(big), CalibrationError);
}

// Strange paths: nothing but a regular calibration file (or nothing) is ever replaced, a
// symlink is written through, and neither reading nor writing waits on a FIFO.
TEST_F(CalibrationFile, WritesOnlyRegularFilesOfItsOwnAndThroughSymlinks) {
  auto error_saving = [&](const fs::path& path) {
    try {
      save_calibration(path, sample());
    } catch (const CalibrationError& e) {
      return std::string(e.what());
    }
    return std::string("(saved)");
  };
  // A symlink to a calibration file: the file is updated, the link stays a link.
  const fs::path real = dir_ / "real.json";
  save_calibration(real, sample());
  const fs::path link = dir_ / "link.json";
  fs::create_symlink("real.json", link);
  Calibration changed = sample();
  changed.machine.hostname = "through-the-link";
  save_calibration(link, changed);
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(load_calibration(real), changed);
  // A dangling symlink: its target is created.
  fs::create_symlink("later.json", dir_ / "dangling.json");
  save_calibration(dir_ / "dangling.json", sample());
  EXPECT_TRUE(fs::is_symlink(dir_ / "dangling.json"));
  EXPECT_EQ(load_calibration(dir_ / "later.json"), sample());

  // Someone else's file, a folder, a FIFO, a device, a symlink to a device: refused, untouched.
  const fs::path other = write("notes.txt", "my notes\n");
  EXPECT_NE(error_saving(other).find("is not a file tide wrote: not replaced"), std::string::npos);
  EXPECT_EQ(io::read_regular_file(other, 100), "my notes\n");
  fs::create_directories(dir_ / "folder");
  EXPECT_NE(error_saving(dir_ / "folder").find("is a folder"), std::string::npos);
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(error_saving(fifo).find("is a FIFO"), std::string::npos);
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_NE(error_saving("/dev/null").find("is a device"), std::string::npos);
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  fs::create_symlink("/dev/null", dir_ / "null.json");
  EXPECT_NE(error_saving(dir_ / "null.json").find("is a device"), std::string::npos);
  // Reading: a FIFO without a writer and a device are refused at once.
  try {
    load_calibration(fifo);
    FAIL() << "read a FIFO";
  } catch (const CalibrationError& e) {
    EXPECT_NE(std::string(e.what()).find("is a FIFO, not a regular file"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(load_calibration("/dev/zero"), CalibrationError);
  // No temporary file is left behind.
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
  }
}

TEST_F(CalibrationFile, DefaultPath) {
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  setenv("HOME", "/home/me", 1);
  EXPECT_EQ(default_calibration_path(), fs::path("/xdg/tide/calibration.json"));
  setenv("XDG_CACHE_HOME", "relative/ignored", 1);  // the XDG spec: only absolute paths count
  EXPECT_EQ(default_calibration_path(), fs::path("/home/me/.cache/tide/calibration.json"));
  unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(default_calibration_path(), fs::path("/home/me/.cache/tide/calibration.json"));
  setenv("TIDE_CALIBRATION_FILE", "/etc/tide.json", 1);
  EXPECT_EQ(default_calibration_path(), fs::path("/etc/tide.json"));
  unsetenv("TIDE_CALIBRATION_FILE");
  unsetenv("HOME");
  EXPECT_THROW(default_calibration_path(), CalibrationError);
}

TEST_F(CalibrationFile, ResolveRatesLayersDefaultsFileAndEnvironment) {
  // No file: built-in defaults, labelled so.
  ResolvedRates r = resolve_rates(std::nullopt);
  EXPECT_TRUE(r.all_builtin());
  EXPECT_FALSE(r.calibration_path.has_value());
  EXPECT_EQ(r.rates, builtin_rates());

  // The default file, once it exists.
  Calibration c = sample();
  save_calibration(default_calibration_path(), c);
  r = resolve_rates(std::nullopt);
  EXPECT_EQ(r.rates, c.rates);
  EXPECT_EQ(r.source[0], RateSource::calibration);
  EXPECT_EQ(r.calibration_path, default_calibration_path());

  // A variable overrides one rate (GB/s → bytes/s).
  setenv("TIDE_RATE_H2D_GBPS", "12.5", 1);
  r = resolve_rates(std::nullopt);
  EXPECT_EQ(r.rates.h2d, 12.5e9);
  EXPECT_EQ(r.source[static_cast<std::size_t>(RateKind::h2d)], RateSource::environment);
  EXPECT_EQ(r.source[static_cast<std::size_t>(RateKind::d2h)], RateSource::calibration);
  unsetenv("TIDE_RATE_H2D_GBPS");

  // An explicit file must exist; a broken default file is an error, not silent defaults.
  EXPECT_THROW(resolve_rates(dir_ / "absent.json"), CalibrationError);
  setenv("TIDE_CALIBRATION_FILE", (dir_ / "absent.json").c_str(), 1);
  try {
    resolve_rates(std::nullopt);
    ADD_FAILURE() << "no error";
  } catch (const config::EnvError& e) {
    EXPECT_NE(std::string(e.what()).find("TIDE_CALIBRATION_FILE=\"" +
                                         (dir_ / "absent.json").string() + "\" is not valid"),
              std::string::npos)
        << e.what();
  }
  unsetenv("TIDE_CALIBRATION_FILE");
  write("cache/tide/calibration.json", "{\"format\": \"tide-calibration\"}");
  EXPECT_THROW(resolve_rates(std::nullopt), CalibrationError);
}

// tide calibrate --ranks N: each rank's rates, measured while all ran, round trip; a file without
// them (every file before them) still reads; malformed entries name where they are.
TEST_F(CalibrationFile, PerRankRatesRoundTrip) {
  Calibration c = sample();
  c.machine.ranks_per_host = 2;
  c.ranks = {{5.1e8, 9.75e9}, {4.9e8, 9.5e9}};
  const std::string text = format_calibration(c);
  EXPECT_NE(text.find("\"ranks\": ["), std::string::npos) << text;
  EXPECT_EQ(parse_calibration(text, "text"), c);
  save_calibration(dir_ / "ranks.json", c);
  EXPECT_EQ(load_calibration(dir_ / "ranks.json").ranks, c.ranks);
  c.ranks.pop_back();  // fewer entries than ranks_per_host
  EXPECT_THROW(format_calibration(c), CalibrationError);

  std::string good = format_calibration(sample());  // ranks_per_host 4, no "ranks"
  EXPECT_TRUE(parse_calibration(good, "old").ranks.empty());
  good.erase(good.rfind('}'));
  for (const auto& [ranks, where] : std::vector<std::pair<std::string, std::string>>{
           {"[]", "ranks: must be an array of machine.ranks_per_host (4)"},
           {"{}", "ranks: must be an array"},
           {R"([{"cpu_update_params_per_s": 1, "memory_bytes_per_s": 1}, 1, 2, 3])",
            "ranks[1]: must be an object"},
           {R"([{"cpu_update_params_per_s": 1}, {}, {}, {}])",
            "ranks[0].memory_bytes_per_s: missing"},
           {R"([{"cpu_update_params_per_s": -1, "memory_bytes_per_s": 1}, {}, {}, {}])",
            "ranks[0].cpu_update_params_per_s: must be a number > 0"},
           {R"([{"cpu_update_params_per_s": 1, "memory_bytes_per_s": 1, "x": 1}, {}, {}, {}])",
            "ranks[0]: unknown member \"x\""}}) {
    try {
      std::string bad = good;
      bad += ", \"ranks\": ";
      bad += ranks;
      bad += "}";
      parse_calibration(bad, "f");
      ADD_FAILURE() << ranks << " accepted";
    } catch (const CalibrationError& e) {
      EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
    }
  }
}

// The factors while copies run (cpu_update_contended_factors) round trip beside the free ones; a
// file without them reads as none, so the planner applies the free factors to both rates; a bad
// value or member is an error naming the file and the key.
TEST_F(CalibrationFile, CpuUpdateContendedFactorsRoundTrip) {
  Calibration c = sample();
  c.cpu_update_factors[UpdateFormat::q8_moments] = 0.4;
  c.cpu_update_factors.contended[static_cast<std::size_t>(UpdateFormat::q8_moments)] = 0.7;
  c.cpu_update_factors.contended[static_cast<std::size_t>(UpdateFormat::bf16_moments)] = 1.1;
  const std::string text = format_calibration(c);
  EXPECT_NE(text.find("\"cpu_update_contended_factors\": {\n    \"bf16_moments\": 1.1,\n    "
                      "\"q8_moments\": 0.7\n  }"),
            std::string::npos)
      << text;
  EXPECT_EQ(parse_calibration(text, "text"), c);
  EXPECT_DOUBLE_EQ(parse_calibration(text, "text")
                       .cpu_update_factors.contended_or_free(UpdateFormat::q8_moments),
                   0.7);
  c.cpu_update_factors.contended = {};
  EXPECT_EQ(format_calibration(c).find("contended_factors"), std::string::npos);
  EXPECT_DOUBLE_EQ(parse_calibration(format_calibration(c), "text")
                       .cpu_update_factors.contended_or_free(UpdateFormat::q8_moments),
                   0.4);
  c.cpu_update_factors.contended[static_cast<std::size_t>(UpdateFormat::bf16_master)] = 200;
  EXPECT_THROW(format_calibration(c), CalibrationError);

  for (const auto& [factors, where] : std::vector<std::pair<std::string, std::string>>{
           {R"({"q8_moments": 0})",
            "cpu_update_contended_factors.q8_moments: must be a number from 0.01 to 100"},
           {R"({"bf16_master": "0.5"})",
            "cpu_update_contended_factors.bf16_master: must be a number"},
           {R"({"fp8_moments": 1})",
            "cpu_update_contended_factors: unknown member \"fp8_moments\""},
           {"1.2", "cpu_update_contended_factors: must be an object"}}) {
    expect_member_refused("cpu_update_contended_factors", factors, where);
  }
}

// The CPU update's factor per state format (tide calibrate measures them) round trips, alone or
// some of them; a file without them (every file before them) reads as none measured; a bad value
// or member is an error naming the file and the key.
TEST_F(CalibrationFile, CpuUpdateFactorsRoundTrip) {
  Calibration c = sample();
  c.cpu_update_factors[UpdateFormat::bf16_moments] = 1.2;
  c.cpu_update_factors[UpdateFormat::q8_moments] = 0.123456789012345;
  c.cpu_update_factors[UpdateFormat::bf16_master] = 0.51;
  c.cpu_update_factors[UpdateFormat::bf16_master_bf16_moments] = 0.79;
  const std::string text = format_calibration(c);
  EXPECT_NE(text.find("\"cpu_update_factors\": {\n    \"bf16_moments\": 1.2,"), std::string::npos)
      << text;
  EXPECT_EQ(parse_calibration(text, "text"), c);
  save_calibration(dir_ / "factors.json", c);
  EXPECT_EQ(load_calibration(dir_ / "factors.json").cpu_update_factors, c.cpu_update_factors);
  c.cpu_update_factors[UpdateFormat::bf16_master] = 0;  // not measured: left out
  EXPECT_EQ(format_calibration(c).find("\"bf16_master\""), std::string::npos);
  EXPECT_EQ(parse_calibration(format_calibration(c), "text"), c);
  for (double bad : {0.001, 101.0, -1.0}) {
    c.cpu_update_factors[UpdateFormat::q8_moments] = bad;
    EXPECT_THROW(format_calibration(c), CalibrationError) << bad;
  }

  // Without the key: nothing measured, and tide plan, the executor and the C ABI use the model.
  EXPECT_FALSE(parse_calibration(kDocumented, "old").cpu_update_factors.any());
  EXPECT_FALSE(parse_calibration(format_calibration(sample()), "old").cpu_update_factors.any());
  for (const auto& [factors, where] : std::vector<std::pair<std::string, std::string>>{
           {R"({"q8_moments": 0})",
            "cpu_update_factors.q8_moments: must be a number from 0.01 to 100"},
           {R"({"q8_moments": 0.001})", "cpu_update_factors.q8_moments: must be a number"},
           {R"({"bf16_moments": -1.2})", "cpu_update_factors.bf16_moments: must be a number"},
           {R"({"bf16_master": 150})", "cpu_update_factors.bf16_master: must be a number"},
           {R"({"bf16_master": "0.5"})", "cpu_update_factors.bf16_master: must be a number"},
           {R"({"bf16_master": null})", "cpu_update_factors.bf16_master: must be a number"},
           {R"({"fp8_moments": 1})",
            "cpu_update_factors: unknown member \"fp8_moments\" (expected: bf16_moments, "
            "q8_moments, bf16_master, bf16_master_bf16_moments)"},
           {"[1.2]", "cpu_update_factors: must be an object"}}) {
    expect_member_refused("cpu_update_factors", factors, where);
  }
}

// The factors are ratios to fp32 state's CPU update rate: they come with the calibration whatever
// overrides that rate (TIDE_RATE_CPU_UPDATE), and a node's share leaves them as they are.
TEST_F(CalibrationFile, CpuUpdateFactorsStayWithAnOverriddenRate) {
  Calibration c = sample();
  c.cpu_update_factors[UpdateFormat::q8_moments] = 0.5;
  save_calibration(dir_ / "c.json", c);
  setenv("TIDE_CALIBRATION_FILE", (dir_ / "c.json").c_str(), 1);
  setenv("TIDE_RATE_CPU_UPDATE", "1e9", 1);
  const ResolvedRates resolved = resolve_rates(std::nullopt);
  EXPECT_EQ(resolved.rates.cpu_update, 1e9);
  EXPECT_EQ(resolved.cpu_update_factors(), c.cpu_update_factors);
  EXPECT_EQ(share_for_node(resolved, 8).cpu_update_factors(), c.cpu_update_factors);
  unsetenv("TIDE_CALIBRATION_FILE");
  EXPECT_FALSE(resolve_rates(std::nullopt).cpu_update_factors().any());  // no file: none
}

// The CPU update rates are shared out from the ranks they were measured with to the ranks that
// plan; copy and GPU rates are each rank's own; given rates are left as they are.
TEST_F(CalibrationFile, NodeRatesShareTheCpuRates) {
  Calibration c = sample();
  c.machine.ranks_per_host = 2;
  save_calibration(dir_ / "two.json", c);
  const ResolvedRates two = resolve_rates(dir_ / "two.json");
  EXPECT_EQ(measured_ranks_per_host(two), 2);
  const ResolvedRates four = share_for_node(two, 4);
  EXPECT_DOUBLE_EQ(four.rates.cpu_update, c.rates.cpu_update / 2);
  EXPECT_DOUBLE_EQ(four.rates.cpu_update_contended, c.rates.cpu_update_contended / 2);
  EXPECT_EQ(four.rates.h2d, c.rates.h2d);
  EXPECT_EQ(four.rates.gpu_update, c.rates.gpu_update);
  // Host memory is the node's too.
  EXPECT_DOUBLE_EQ(four.rates.host_memory, c.rates.host_memory / 2);
  EXPECT_DOUBLE_EQ(four.rates.host_memory_contended, c.rates.host_memory_contended / 2);
  EXPECT_DOUBLE_EQ(share_for_node(two, 1).rates.cpu_update, 2 * c.rates.cpu_update);
  EXPECT_EQ(share_for_node(two, 2).rates, two.rates);
  ResolvedRates given = two;
  given.source[static_cast<std::size_t>(RateKind::cpu_update)] = RateSource::environment;
  EXPECT_EQ(share_for_node(given, 4).rates.cpu_update, c.rates.cpu_update);
  EXPECT_THROW(share_for_node(two, 0), std::invalid_argument);
  // Built-in rates are those of a 4-rank node.
  ResolvedRates builtin;
  builtin.rates = builtin_rates();
  builtin.source.fill(RateSource::builtin);
  EXPECT_EQ(share_for_node(builtin, kBuiltinRanksPerHost).rates, builtin_rates());
}

TEST_F(CalibrationFile, ThisMachineKnowsItsCpu) {
  const MachineInfo m = this_machine();
  EXPECT_FALSE(m.hostname.empty());
  EXPECT_GE(m.cpu_threads, 1);
  const std::string stamp = utc_timestamp();
  EXPECT_EQ(stamp.size(), 20u);
  EXPECT_EQ(stamp.back(), 'Z');
}

}  // namespace
}  // namespace tide::planner
