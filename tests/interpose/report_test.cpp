// The report a process writes at exit (or on SIGTERM): valid JSON with the peak per phase, the
// top allocation sites named by function, the entry points used, and a Perfetto-loadable trace.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "preload_test_support.h"

extern char** environ;

namespace tide::interpose::test {
namespace {

// A strict JSON syntax check: enough to know a viewer will load the file.
class JsonChecker {
 public:
  explicit JsonChecker(std::string_view text) : s_(text) {}
  bool valid() {
    const bool ok = value();
    space();
    return ok && i_ == s_.size();
  }

 private:
  void space() {
    while (i_ < s_.size() &&
           (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) {
      ++i_;
    }
  }
  bool literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }
  bool string() {
    if (i_ >= s_.size() || s_[i_] != '"') return false;
    for (++i_; i_ < s_.size(); ++i_) {
      if (s_[i_] == '\\') {
        ++i_;
      } else if (s_[i_] == '"') {
        ++i_;
        return true;
      } else if (static_cast<unsigned char>(s_[i_]) < 0x20) {
        return false;
      }
    }
    return false;
  }
  bool number() {
    const std::size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.' ||
                              s_[i_] == 'e' || s_[i_] == 'E' || s_[i_] == '+' || s_[i_] == '-')) {
      ++i_;
    }
    return i_ > start;
  }
  bool value() {
    space();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') return members('}', true);
    if (c == '[') return members(']', false);
    if (c == '"') return string();
    if (c == 't') return literal("true");
    if (c == 'f') return literal("false");
    if (c == 'n') return literal("null");
    return number();
  }
  bool members(char close, bool object) {
    ++i_;
    space();
    if (i_ < s_.size() && s_[i_] == close) {
      ++i_;
      return true;
    }
    while (true) {
      space();
      if (object) {
        if (!string()) return false;
        space();
        if (i_ >= s_.size() || s_[i_] != ':') return false;
        ++i_;
      }
      if (!value()) return false;
      space();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == close) {
        ++i_;
        return true;
      }
      return false;
    }
  }
  std::string_view s_;
  std::size_t i_ = 0;
};

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct ChildRun {
  int status = -1;
  std::string report_path;
  std::string report;
  std::string trace;
};

ChildRun run_child(const std::string& mode, const std::vector<std::string>& extra_env) {
  const char* child = std::getenv("TIDE_REPORT_CHILD");
  const char* out = std::getenv("TIDE_TEST_OUTPUT");
  EXPECT_NE(child, nullptr);
  EXPECT_NE(out, nullptr);
  ChildRun run;
  if (child == nullptr || out == nullptr) return run;
  std::filesystem::create_directories(out);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  env.push_back("TIDE_REPORT=" + std::string(out) + "/report-" + mode + "-%p.json");
  env.push_back("TIDE_STACKS=1");
  for (const auto& e : extra_env) env.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string arg0 = child;
  std::string arg1 = mode;
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, child, nullptr, nullptr, argv, envp.data()), 0);
  EXPECT_EQ(waitpid(pid, &run.status, 0), pid);
  run.report_path = std::string(out) + "/report-" + mode + "-" + std::to_string(pid) + ".json";
  run.report = read(run.report_path);
  run.trace =
      read(std::string(out) + "/report-" + mode + "-" + std::to_string(pid) + ".trace.json");
  return run;
}

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

constexpr std::uint64_t kMiB = 1 << 20;

TEST(Report, AtExitWithPhasePeaksSitesAndTrace) {
  const ChildRun run = run_child("alloc", {});
  ASSERT_TRUE(WIFEXITED(run.status));
  ASSERT_EQ(WEXITSTATUS(run.status), 0);
  ASSERT_FALSE(run.report.empty()) << "no report at " << run.report_path;
  EXPECT_TRUE(JsonChecker(run.report).valid()) << run.report;
  EXPECT_TRUE(contains(run.report, "\"tide_report\": 1"));
  // Peak per phase: forward 12 MiB, backward 20 MiB, update 5 MiB; 5 MiB still live at exit.
  const std::string phases =
      "\"phase_peak_bytes\": {\"unmarked\": 0, \"forward\": " + std::to_string(12 * kMiB) +
      ", \"backward\": " + std::to_string(20 * kMiB) + ", \"update\": " + std::to_string(5 * kMiB) +
      "}";
  EXPECT_TRUE(contains(run.report, phases)) << run.report;
  EXPECT_TRUE(contains(run.report, "\"peak_bytes\": " + std::to_string(20 * kMiB)));
  EXPECT_TRUE(contains(run.report, "\"live_bytes_at_exit\": " + std::to_string(5 * kMiB)));
  // Entry points, and sites by function name, the largest first.
  EXPECT_TRUE(contains(run.report, "\"cuMemAlloc_v2\": {\"calls\": 5, \"failures\": 0"));
  EXPECT_TRUE(contains(run.report, "\"cuGetProcAddress_v2\""));
  const auto forward = run.report.find("report_child_forward");
  const auto backward = run.report.find("report_child_backward");
  const auto update = run.report.find("report_child_update");
  ASSERT_NE(forward, std::string::npos) << run.report;
  ASSERT_NE(backward, std::string::npos);
  ASSERT_NE(update, std::string::npos);
  EXPECT_LT(forward, backward) << "12 MiB from forward ranks above 8 MiB from backward";
  EXPECT_LT(backward, update);
  // The iteration (in progress at exit) with its phases, and the headroom forecast.
  EXPECT_TRUE(contains(run.report, "\"phases_from\": \"marks\""));
  EXPECT_TRUE(contains(run.report, "\"headroom_forecast\""));
  // The trace: Chrome JSON (Perfetto loads it) with the memory counter and the phases.
  ASSERT_FALSE(run.trace.empty());
  EXPECT_TRUE(JsonChecker(run.trace).valid()) << run.trace;
  EXPECT_TRUE(contains(run.trace, "\"traceEvents\""));
  EXPECT_TRUE(contains(run.trace, "\"ph\":\"C\",\"name\":\"memory\"")) << run.trace;
  EXPECT_TRUE(contains(run.trace, "\"ph\":\"X\",\"name\":\"backward\""));
  EXPECT_TRUE(contains(run.report, "\"traces\": [\"" +
                                       run.report_path.substr(0, run.report_path.size() - 5) +
                                       ".trace.json\"]"));
}

TEST(Report, OnSigtermThenTheProcessDiesOfIt) {
  const ChildRun run = run_child("signal", {});
  ASSERT_TRUE(WIFSIGNALED(run.status)) << "status " << run.status;
  EXPECT_EQ(WTERMSIG(run.status), SIGTERM);
  ASSERT_FALSE(run.report.empty()) << "no report at " << run.report_path;
  EXPECT_TRUE(JsonChecker(run.report).valid());
  EXPECT_TRUE(contains(run.report, "\"peak_bytes\": " + std::to_string(20 * kMiB)));
}

TEST(Report, AnUnmarkedTrainersIterationsAndPhasesAreDetected) {
  const ChildRun run = run_child("loop", {});
  ASSERT_TRUE(WIFEXITED(run.status));
  ASSERT_FALSE(run.report.empty());
  EXPECT_TRUE(JsonChecker(run.report).valid());
  EXPECT_TRUE(contains(run.report, "\"phases_from\": \"detected\"")) << run.report;
  EXPECT_TRUE(contains(run.report, "\"peak_bytes\": " + std::to_string(32 * kMiB)));
  EXPECT_TRUE(contains(run.trace, "\"ph\":\"X\",\"name\":\"forward\""));
}

TEST(Report, LimitRejectionsAreCounted) {
  const ChildRun run = run_child("alloc", {"TIDE_MEMORY_LIMIT=16MiB"});
  ASSERT_TRUE(WIFEXITED(run.status));
  ASSERT_FALSE(run.report.empty());
  EXPECT_TRUE(contains(run.report, "\"memory_limit_bytes\": " + std::to_string(16 * kMiB)));
  EXPECT_TRUE(contains(run.report, "\"limit_rejections\": 1")) << run.report;
  EXPECT_TRUE(contains(run.report, "\"peak_bytes\": " + std::to_string(12 * kMiB)));
}

}  // namespace
}  // namespace tide::interpose::test
