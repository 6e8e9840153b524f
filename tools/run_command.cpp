// `tide run [--limit SIZE] [--report PATH] [--stacks] [--optimizer] -- COMMAND [ARGS...]`: runs an
// unmodified program under tide's interposer (libtide_preload.so): memory telemetry, an optional
// device memory limit, allocation call stacks, a report at exit.
//
// The command runs as a child (fork, exec, wait) with LD_PRELOAD and the knobs set; tide passes
// its exit status through, or dies of the same signal. While it waits, tide ignores SIGINT and
// SIGQUIT (a terminal sends them to the child too) and forwards SIGTERM, SIGHUP, SIGUSR1 and
// SIGUSR2 (which a launcher sends to tide alone).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/env.h"
#include "config/knobs.h"
#include "tools/command.h"
#include "tools/report_directory.h"

namespace tide::tools {
namespace {

namespace fs = std::filesystem;

constexpr const char* kUsage =
    "usage: tide run [--limit SIZE] [--report PATH] [--stacks] [--optimizer] -- COMMAND [ARGS...]\n"
    "\n"
    "Runs COMMAND under tide's interposer (libtide_preload.so): device memory telemetry per\n"
    "phase, a report at exit, and optionally a memory limit and allocation call stacks.\n"
    "\n"
    "  --limit SIZE    device memory limit per device (e.g. 20GiB): cuMemGetInfo reports it and\n"
    "                  allocations beyond it fail with out-of-memory (TIDE_MEMORY_LIMIT)\n"
    "  --report PATH   write the report here at exit; %p becomes the process id, the Perfetto\n"
    "                  trace goes next to it as *.trace.json (default: TIDE_REPORT if set,\n"
    "                  else $XDG_STATE_HOME/tide/reports/tide-report.%p.json, XDG_STATE_HOME\n"
    "                  being ~/.local/state unless set; the 64 most recent reports stay there)\n"
    "  --stacks        capture allocation call stacks with libunwind (TIDE_STACKS)\n"
    "  --optimizer     Python programs: replace torch.optim.Adam/AdamW by tide's offloading\n"
    "                  optimizer, through a start-up hook (sitecustomize)\n"
    "\n"
    "Every TIDE_* variable set is checked before COMMAND starts (tide env lists them).\n";

struct Options {
  std::optional<std::string> limit;
  std::optional<std::string> report;
  bool stacks = false;
  bool optimizer = false;
  std::vector<char*> command;  // null-terminated
};

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct HelpAsked {};

// `--name VALUE` or `--name=VALUE` at argv[i]; advances i past what it used.
std::optional<std::string> option_value(std::string_view name, int argc, char** argv, int& i) {
  const std::string_view arg = argv[i];
  if (arg == name) {
    if (i + 1 >= argc) throw UsageError(std::string(name) + " needs a value");
    return std::string(argv[++i]);
  }
  if (arg.size() > name.size() && arg.substr(0, name.size()) == name && arg[name.size()] == '=') {
    return std::string(arg.substr(name.size() + 1));
  }
  return std::nullopt;
}

Options parse(int argc, char** argv) {
  Options options;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "--help" || arg == "-h") throw HelpAsked{};
    if (arg == "--stacks") {
      options.stacks = true;
    } else if (arg == "--optimizer") {
      options.optimizer = true;
    } else if (auto limit = option_value("--limit", argc, argv, i)) {
      // Throws with what it accepts.
      config::parse_bytes("--limit", *limit, 1, std::numeric_limits<std::uint64_t>::max(),
                          config::kLimitAccepts);
      options.limit = *limit;
    } else if (auto report = option_value("--report", argc, argv, i)) {
      if (report->empty()) throw UsageError("--report needs a path");
      if (arg == "--report" && (*report)[0] == '-') {
        // `--report -- cmd`: the path is missing, not "--".
        throw UsageError("--report needs a path, not '" + *report +
                         "' (write --report=PATH for a path that starts with '-')");
      }
      options.report = *report;
    } else if (arg.size() > 1 && arg[0] == '-') {
      throw UsageError("unknown option " + std::string(arg));
    } else {
      break;  // the command, without "--"
    }
  }
  for (; i < argc; ++i) options.command.push_back(argv[i]);
  if (options.command.empty()) throw UsageError("no command to run");
  options.command.push_back(nullptr);
  return options;
}

fs::path executable_dir() {
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  if (error) throw std::runtime_error("cannot find the tide executable: " + error.message());
  return exe.parent_path();
}

// libtide_preload.so next to the executable: build/lib for build/bin/tide, tide/lib for the pip
// package's tide/bin/tide.
fs::path preload_library(const fs::path& bin) {
  fs::path library = (bin / ".." / "lib" / "libtide_preload.so").lexically_normal();
  if (!fs::is_regular_file(library)) {
    throw std::runtime_error("the interposer library is missing: " + library.string() +
                             " (build the tide_preload target, or reinstall tide)");
  }
  return library;
}

// The directory holding tide's sitecustomize.py: build/_startup or the package's tide/_startup.
fs::path startup_dir(const fs::path& bin) {
  fs::path dir = (bin / ".." / "_startup").lexically_normal();
  if (!fs::is_regular_file(dir / "sitecustomize.py")) {
    throw std::runtime_error("the Python start-up hook is missing: " +
                             (dir / "sitecustomize.py").string());
  }
  return dir;
}

bool is_sanitizer_runtime(std::string_view path) {
  const std::string_view name = path.substr(path.find_last_of('/') + 1);
  for (std::string_view prefix : {"libasan", "libtsan", "libubsan", "libclang_rt.asan",
                                  "libclang_rt.tsan", "libclang_rt.ubsan"}) {
    if (name.substr(0, prefix.size()) == prefix) return true;
  }
  return false;
}

// LD_PRELOAD with the preload first, except after sanitizer runtimes, which must come first of
// all; any earlier copy of the preload is dropped.
std::string with_preload(const std::string& preload, const char* existing) {
  std::vector<std::string> sanitizers;
  std::vector<std::string> others;
  std::string_view rest = existing != nullptr ? existing : "";
  while (!rest.empty()) {
    const std::size_t end = rest.find_first_of(": ");
    const std::string_view entry = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    if (entry.empty() || entry == preload) continue;
    (is_sanitizer_runtime(entry) ? sanitizers : others).emplace_back(entry);
  }
  std::string out;
  auto append = [&out](const std::string& entry) {
    if (!out.empty()) out += ':';
    out += entry;
  };
  for (const auto& s : sanitizers) append(s);
  append(preload);
  for (const auto& o : others) append(o);
  return out;
}

// TIDE_REPORT for a run that names no report: the per-user report directory. Without one, the
// run goes on with the summary line alone, and says so.
void setenv_default_report() {
  const std::optional<fs::path> dir = default_report_directory();
  if (!dir) {
    std::fprintf(stderr,
                 "tide run: no report file (neither XDG_STATE_HOME nor HOME is set; --report "
                 "PATH writes one)\n");
    return;
  }
  try {
    setenv("TIDE_REPORT", prepare_report_directory(*dir, kKeptReports).c_str(), 1);
  } catch (const fs::filesystem_error& e) {
    std::fprintf(stderr, "tide run: no report file (%s: %s; --report PATH writes one)\n",
                 dir->c_str(), e.code().message().c_str());
  }
}

void set_environment(const Options& options) {
  const fs::path bin = executable_dir();
  const std::string preload = preload_library(bin).string();
  setenv("LD_PRELOAD", with_preload(preload, std::getenv("LD_PRELOAD")).c_str(), 1);
  if (options.limit) setenv("TIDE_MEMORY_LIMIT", options.limit->c_str(), 1);
  if (options.report) {
    setenv("TIDE_REPORT", options.report->c_str(), 1);
  } else if (!config::env_text("TIDE_REPORT")) {
    setenv_default_report();
  }
  if (options.stacks) setenv("TIDE_STACKS", "1", 1);
  if (options.optimizer) {
    std::string path = startup_dir(bin).string();
    if (const char* existing = std::getenv("PYTHONPATH"); existing != nullptr && *existing) {
      path += ':';
      path += existing;
    }
    setenv("PYTHONPATH", path.c_str(), 1);
  }
}

volatile sig_atomic_t g_child = 0;

void forward_signal(int signal) {
  if (g_child > 0) kill(static_cast<pid_t>(g_child), signal);
}

// Dies of `signal` as the child did, without a core dump of tide itself.
int die_like(int signal) {
  const rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  std::signal(signal, SIG_DFL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, signal);
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
  raise(signal);
  return 128 + signal;  // if the signal did not end us
}

}  // namespace

int run_command(int argc, char** argv) {
  Options options;
  try {
    options = parse(argc, argv);
  } catch (const HelpAsked&) {
    std::fputs(kUsage, stdout);
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "tide run: %s\n\n%s", e.what(), kUsage);
    return 2;
  } catch (const config::EnvError& e) {
    std::fprintf(stderr, "tide run: %s\n", e.what());
    return 2;
  }
  set_environment(options);
  try {
    // What the interposer and tide's libraries would refuse at the program's first CUDA call,
    // refused now, before it starts.
    config::check_environment();
  } catch (const config::EnvError& e) {
    std::fprintf(stderr, "tide run: %s (nothing was run)\n", e.what());
    return 2;
  }

  std::fflush(nullptr);
  const pid_t child = fork();
  if (child < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  if (child == 0) {
    execvp(options.command[0], options.command.data());
    const int error = errno;
    std::fprintf(stderr, "tide run: cannot run %s: %s\n", options.command[0], std::strerror(error));
    _exit(error == ENOENT ? 127 : 126);
  }
  g_child = child;
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGQUIT, SIG_IGN);
  for (const int signal : {SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) {
    struct sigaction forward {};
    forward.sa_handler = &forward_signal;
    sigemptyset(&forward.sa_mask);
    forward.sa_flags = SA_RESTART;
    sigaction(signal, &forward, nullptr);
  }

  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error(std::string("wait: ") + std::strerror(errno));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return die_like(WTERMSIG(status));
  return 1;
}

}  // namespace tide::tools
