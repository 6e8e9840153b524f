// `tide calibrate`: measures the performance model's rates on this machine with tide's real
// kernels and copies, and writes them to the calibration file `tide plan` and the executor read.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "config/env.h"
#include "driver/context.h"
#include "kernels/thread_pool.h"
#include "scheduler/calibration_file.h"
#include "scheduler/measure.h"
#include "scheduler/units.h"
#include "tools/command.h"

namespace tide::tools {
namespace {

using namespace tide::scheduler;

constexpr const char* kUsage = R"(usage: tide calibrate [options]

Measures the rates of tide's performance model on this machine, with tide's own CPU and GPU Adam
kernels and pinned-memory copies, and writes them to the calibration file: TIDE_CALIBRATION_FILE,
else $XDG_CACHE_HOME/tide/calibration.json, else ~/.cache/tide/calibration.json. Run it with the
other ranks of the node idle, or with --ranks-per-host to record how many ran at once.

options:
  --long                 a longer, steadier measurement (32 Mi parameters, 5 repeats; about a
                         minute on a small machine) instead of the default few seconds
  --params N             parameters per measured buffer (default 4Mi = 4194304; 12 bytes of
                         state each, twice, on the host and on the GPU)
  --repeats N            timed runs per rate, the best kept (default 3)
  --output FILE          write here instead of the default path
  --ranks-per-host N     ranks that measured at the same time (recorded; default 1)
  --dry-run              measure and print, write nothing
)";

std::string_view value_of(int& i, int argc, char** argv) {
  if (i + 1 >= argc) throw std::invalid_argument(std::string(argv[i]) + " needs a value");
  return argv[++i];
}

}  // namespace

int calibrate_command(int argc, char** argv) {
  MeasureOptions options;
  std::optional<std::filesystem::path> output;
  int ranks = 1;
  bool dry_run = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--long") {
      options.params = std::uint64_t{32} << 20;
      options.repeats = 5;
    } else if (arg == "--params") {
      options.params = parse_count("--params", value_of(i, argc, argv), 1024);
      if (options.params > (std::uint64_t{1} << 31)) {
        throw std::invalid_argument("--params accepts 1024 to 2^31 parameters");
      }
    } else if (arg == "--repeats") {
      options.repeats =
          static_cast<int>(config::parse_int("--repeats", value_of(i, argc, argv), 1, 100));
    } else if (arg == "--output") {
      output = std::filesystem::path(value_of(i, argc, argv));
    } else if (arg == "--ranks-per-host") {
      ranks =
          static_cast<int>(config::parse_int("--ranks-per-host", value_of(i, argc, argv), 1, 1024));
    } else if (arg == "--dry-run") {
      dry_run = true;
    } else {
      throw std::invalid_argument("unknown argument '" + std::string(arg) +
                                  "' (tide calibrate --help lists them)");
    }
  }
  const std::filesystem::path path = output ? *output : default_calibration_path();
  if (!dry_run) check_calibration_path(path);  // before a measurement it could not save

  driver::PrimaryContext context(0);
  Calibration c;
  c.machine = this_machine();
  c.machine.cpu_threads = static_cast<int>(kernels::cpu_pool().size());
  c.machine.ranks_per_host = ranks;
  c.machine.gpu_name = driver::device_name(0);
  c.machine.gpu_memory_bytes = driver::memory_info().total_bytes;
  const bool standin = c.machine.gpu_name.find("stand-in") != std::string::npos;
  std::printf("tide calibrate: %s, %d CPU threads, %llu parameters per buffer, best of %d\n",
              c.machine.gpu_name.c_str(), c.machine.cpu_threads,
              static_cast<unsigned long long>(options.params), options.repeats);
  if (standin) {
    std::printf(
        "note: no GPU: measuring through the host stand-in driver. Copy rates are the stand-in's "
        "(memcpy, or TIDE_STANDIN_*_GBPS), and the GPU update is its host twin on one thread: "
        "rates of this machine's CPU, not of a GPU.\n");
  }
  options.progress = [](RateKind kind, double value) {
    const RateInfo& info = rate_info(kind);
    std::printf("  %-36.*s %s\n", static_cast<int>(info.description.size()),
                info.description.data(), format_rate(kind, value).c_str());
    std::fflush(stdout);
  };
  c.rates = measure_rates(options);
  c.measured_at = utc_timestamp();
  if (dry_run) {
    std::printf("dry run: nothing written (would write %s)\n", path.string().c_str());
  } else {
    save_calibration(path, c);
    std::printf("wrote %s\n", path.string().c_str());
  }
  return 0;
}

}  // namespace tide::tools
