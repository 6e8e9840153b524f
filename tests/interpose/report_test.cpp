// The report a process writes at exit (or on SIGTERM): valid JSON with the peak per phase, the
// top allocation sites named by function, the entry points used, and a Perfetto-loadable trace.
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "io/json.h"
#include "preload_test_support.h"

extern char** environ;

namespace tide::interpose::test {
namespace {

// Whether `text` is JSON (io/json.h's strict reader): enough to know a viewer will load the file.
bool valid_json(const std::string& text) {
  try {
    io::json::parse(text);
    return true;
  } catch (const io::json::ParseError&) {
    return false;
  }
}

// The contents of a regular file ("" for anything else: a FIFO is never opened).
std::string read(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) return "";
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct ChildRun {
  int status = -1;
  bool exited_in_time = false;
  std::string report_path;
  std::string report;
  std::string trace;
  std::string err;  // its stderr
};

// Runs the report child in `mode` under the preload with TIDE_REPORT=`report` (by default a new
// path for each run in TIDE_TEST_OUTPUT), waits for it at most a minute (then kills it), and
// reads back its report, its trace and its stderr.
ChildRun run_child(const std::string& mode, const std::vector<std::string>& extra_env,
                   const std::string& report = "") {
  static int runs = 0;
  const char* child = std::getenv("TIDE_REPORT_CHILD");
  const char* out = std::getenv("TIDE_TEST_OUTPUT");
  EXPECT_NE(child, nullptr);
  EXPECT_NE(out, nullptr);
  ChildRun run;
  if (child == nullptr || out == nullptr) return run;
  std::filesystem::create_directories(out);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  env.push_back("TIDE_REPORT=" +
                (report.empty() ? std::string(out) + "/report-" + mode + "-%p.json" : report));
  env.push_back("TIDE_STACKS=1");
  for (const auto& e : extra_env) env.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string arg0 = child;
  std::string arg1 = mode;
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  const std::string err_path =
      std::string(out) + "/stderr-" + mode + "-" + std::to_string(++runs) + ".txt";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, child, &actions, nullptr, argv, envp.data()), 0);
  posix_spawn_file_actions_destroy(&actions);
  for (int i = 0; i < 600 && !run.exited_in_time; ++i) {
    const pid_t r = waitpid(pid, &run.status, WNOHANG);
    if (r == pid) {
      run.exited_in_time = true;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  if (!run.exited_in_time) {
    kill(pid, SIGKILL);
    waitpid(pid, &run.status, 0);
  }
  EXPECT_TRUE(run.exited_in_time) << "the child did not exit within a minute (killed)";
  const std::string base = report.empty()
                               ? std::string(out) + "/report-" + mode + "-" + std::to_string(pid)
                               : report.substr(0, report.size() - 5);  // ".json"
  run.report_path = base + ".json";
  run.report = read(run.report_path);
  run.trace = read(base + ".trace.json");
  run.err = read(err_path);
  if (report.empty()) {
    // Read: gone, so that a later child given the same process id cannot pass on this one's.
    std::filesystem::remove(run.report_path);
    std::filesystem::remove(base + ".trace.json");
  }
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
  EXPECT_TRUE(valid_json(run.report)) << run.report;
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
  EXPECT_TRUE(valid_json(run.trace)) << run.trace;
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
  EXPECT_TRUE(valid_json(run.report));
  EXPECT_TRUE(contains(run.report, "\"peak_bytes\": " + std::to_string(20 * kMiB)));
}

// The detector reads a curve whose time axis is the OS scheduler's: on a loaded machine one
// stall of the child (hundreds of ms against its 5 ms steps) can break the period, which is
// the detector doing its job. So the child gets three tries; every try must still report.
TEST(Report, AnUnmarkedTrainersIterationsAndPhasesAreDetected) {
  ChildRun run;
  for (int attempt = 0; attempt < 3; ++attempt) {
    run = run_child("loop", {});
    ASSERT_TRUE(WIFEXITED(run.status));
    ASSERT_TRUE(valid_json(run.report)) << run.report;
    if (contains(run.report, "\"phases_from\": \"detected\"")) break;
  }
  ASSERT_FALSE(run.report.empty());
  EXPECT_TRUE(valid_json(run.report));
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

// Where TIDE_REPORT points is the user's to name, and may be anything: the report replaces only
// nothing or a report of tide's own (written through a symlink, which stays a link), and never
// another file, a FIFO (where opening for writing would wait forever) or a device; the program
// runs and exits as it would without tide, the refusal said on stderr.
class ReportPath : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* out = std::getenv("TIDE_TEST_OUTPUT");
    ASSERT_NE(out, nullptr);
    dir_ = std::filesystem::path(out) / "paths";
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static void expect_refused(const ChildRun& run, std::string_view why) {
    ASSERT_TRUE(WIFEXITED(run.status));
    EXPECT_EQ(WEXITSTATUS(run.status), 0);
    EXPECT_TRUE(contains(run.err, "could not write the report")) << run.err;
    EXPECT_TRUE(contains(run.err, why)) << run.err;
  }

  std::filesystem::path dir_;
};

TEST_F(ReportPath, WrittenThroughASymlinkAndOverItsOwnReport) {
  namespace fs = std::filesystem;
  fs::create_symlink("real.json", path("link.json"));
  const ChildRun first = run_child("alloc", {}, path("link.json"));
  ASSERT_TRUE(first.exited_in_time);
  EXPECT_TRUE(fs::is_symlink(path("link.json")));
  EXPECT_TRUE(valid_json(read(path("real.json")))) << first.err;
  EXPECT_TRUE(contains(read(path("real.json")), "\"tide_report\": 1"));
  EXPECT_TRUE(valid_json(first.trace));
  // Again: the report and the trace tide wrote are replaced.
  const ChildRun second = run_child("alloc", {}, path("link.json"));
  EXPECT_TRUE(fs::is_symlink(path("link.json")));
  EXPECT_TRUE(valid_json(second.report)) << second.err;
  EXPECT_NE(second.report, first.report);  // another process, another pid
  EXPECT_TRUE(valid_json(second.trace));
  EXPECT_FALSE(contains(second.err, "could not write")) << second.err;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
  }
}

TEST_F(ReportPath, AnotherFileAFifoOrADeviceIsLeftAlone) {
  namespace fs = std::filesystem;
  {
    std::ofstream notes(path("notes.json"));
    notes << "my notes\n";
  }
  const ChildRun other = run_child("alloc", {}, path("notes.json"));
  expect_refused(other, "is not a file tide wrote");
  EXPECT_EQ(read(path("notes.json")), "my notes\n");
  EXPECT_FALSE(fs::exists(path("notes.trace.json")));

  fs::create_symlink("notes.json", path("to-notes.json"));
  expect_refused(run_child("alloc", {}, path("to-notes.json")), "is not a file tide wrote");
  EXPECT_EQ(read(path("notes.json")), "my notes\n");

  ASSERT_EQ(mkfifo(path("fifo.json").c_str(), 0600), 0);
  expect_refused(run_child("alloc", {}, path("fifo.json")), "is a FIFO");
  EXPECT_TRUE(fs::is_fifo(path("fifo.json")));

  fs::create_symlink("/dev/null", path("null.json"));
  expect_refused(run_child("alloc", {}, path("null.json")), "is a device");
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  EXPECT_TRUE(fs::is_symlink(path("null.json")));
  EXPECT_FALSE(fs::exists(path("null.trace.json")));

  // A folder that does not exist is not made.
  expect_refused(run_child("alloc", {}, path("no/such/folder/report.json")),
                 "No such file or directory");
  EXPECT_FALSE(fs::exists(path("no")));
}

}  // namespace
}  // namespace tide::interpose::test
