// `tide calibrate`: measures the performance model's rates on this machine with tide's real
// kernels and copies, and writes them to the calibration file `tide plan` and the executor read.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/env.h"
#include "config/node.h"
#include "driver/context.h"
#include "kernels/thread_pool.h"
#include "planner/calibration_file.h"
#include "planner/measure.h"
#include "planner/rank_processes.h"
#include "planner/units.h"
#include "tools/command.h"

namespace tide::tools {
namespace {

using namespace tide::planner;

constexpr const char* kUsage = R"(usage: tide calibrate [options]

Measures the rates of tide's performance model on this machine, with tide's own CPU and GPU Adam
kernels and pinned-memory copies, and writes them to the calibration file: TIDE_CALIBRATION_FILE,
else $XDG_CACHE_HOME/tide/calibration.json, else ~/.cache/tide/calibration.json. Run it with the
node idle. With --ranks N it measures the node as N local ranks use it: N processes, each on its
share of the cores, update and copy memory at once, and the file holds each rank's rates and, as
the rates, one rank's share (the slowest's). It also measures the CPU update of each state format
(bf16 moments, 8-bit moments, bf16 master weights with fp32 or bf16 moments) against fp32 state's,
in rounds of one update of each (with --ranks, all ranks at once), and writes the factors the
planner applies to the CPU update rate for that format; without --ranks, once more while copies
run in both directions, for the factors of the CPU update rate while copying (a memory-bound
format loses more to the copies than a compute-bound one). Host memory bandwidth is measured
with an Adam-like pass over four buffers of 128 MiB (512 MiB with --long) on the CPU update's
threads, alone and while copies run in both directions (the pass's bytes and the copies'); with
--ranks, each rank's share.

options:
  --long                 a longer, steadier measurement (32 Mi parameters, 5 repeats; about a
                         minute on a small machine) instead of the default few seconds
  --params N             parameters per measured buffer (default 4Mi = 4194304; 12 bytes of
                         state each, twice, on the host and on the GPU)
  --repeats N            timed runs per rate, the best kept (default 3)
  --output FILE          write here instead of the default path
  --ranks N              measure N local ranks updating at once (1 to 256; default 1)
  --ranks-per-host N     ranks that measured at the same time, when they were started apart
                         (recorded only; default 1)
  --dry-run              measure and print, write nothing
)";

std::string_view value_of(int& i, int argc, char** argv) {
  if (i + 1 >= argc) throw std::invalid_argument(std::string(argv[i]) + " needs a value");
  return argv[++i];
}

// The rates of one rank of the node: the CPU update as the slowest rank measured it, the update
// while copies run scaled alike, and no copy faster than the rank's share of host memory moves.
void share_measured_rates(Calibration& c, std::vector<RankRates> per_rank) {
  RankRates slowest = per_rank.front();
  for (const RankRates& r : per_rank) {
    slowest.cpu_update = std::min(slowest.cpu_update, r.cpu_update);
    slowest.memory = std::min(slowest.memory, r.memory);
  }
  const double share = std::min(1.0, slowest.cpu_update / c.rates.cpu_update);
  c.rates.cpu_update_contended *= share;
  c.rates.cpu_update = std::min(c.rates.cpu_update, slowest.cpu_update);
  for (double* copy : {&c.rates.h2d, &c.rates.d2h, &c.rates.h2d_duplex, &c.rates.d2h_duplex}) {
    *copy = std::min(*copy, slowest.memory);
  }
  // This process measured host memory with the whole node's cores: the ranks share it.
  const auto ranks = static_cast<double>(per_rank.size());
  c.rates.host_memory /= ranks;
  c.rates.host_memory_contended /= ranks;
  std::printf("%zu ranks at once, per rank:\n", per_rank.size());
  for (std::size_t i = 0; i < per_rank.size(); ++i) {
    std::printf("  rank %zu  CPU update %s, memory copy %s\n", i,
                format_rate(RateKind::cpu_update, per_rank[i].cpu_update).c_str(),
                format_rate(RateKind::h2d, per_rank[i].memory).c_str());
  }
  std::printf("  one rank's share: CPU update %s (%.0f%% of one rank alone), while copying %s\n",
              format_rate(RateKind::cpu_update, c.rates.cpu_update).c_str(), 100 * share,
              format_rate(RateKind::cpu_update, c.rates.cpu_update_contended).c_str());
  c.ranks = std::move(per_rank);
}

// What the ranks measured at once.
struct RanksMeasured {
  std::vector<RankRates> rates;
  std::vector<CpuFormatRates> formats;
};

// `ranks` processes, each on its share of the cores, measuring at once: the CPU update and a
// memory copy, then the CPU update of each state format.
RanksMeasured measure_ranks_at_once(int ranks, std::uint64_t params, int repeats) {
  const std::vector<std::string> lines =
      run_ranks(ranks, /*local_env=*/true, [&](int, const RankBarrier& barrier) {
        const driver::CurrentContext context(0);
        const RankRates r = measure_rank_rates(params, repeats, barrier);
        const CpuFormatRates formats = measure_cpu_formats(params, repeats, {}, barrier);
        std::string line;
        auto add = [&line](double x) {
          char text[32];
          std::snprintf(text, sizeof text, "%.17g", x);
          line += (line.empty() ? "" : " ") + std::string(text);
        };
        add(r.cpu_update);
        add(r.memory);
        add(formats.fp32);
        for (double f : formats.format) add(f);
        return line;
      });
  RanksMeasured out;
  for (const std::string& line : lines) {
    RankRates r;
    CpuFormatRates formats;
    int used = 0;
    const char* p = line.c_str();
    bool ok = std::sscanf(p, "%lg %lg %lg%n", &r.cpu_update, &r.memory, &formats.fp32, &used) == 3;
    for (double& f : formats.format) {
      p += used;
      ok = ok && std::sscanf(p, " %lg%n", &f, &used) == 1;
    }
    if (!ok) throw std::runtime_error("tide calibrate --ranks: a rank reported \"" + line + "\"");
    out.rates.push_back(r);
    out.formats.push_back(formats);
  }
  return out;
}

void print_factors(const CpuUpdateFactors& factors, const std::vector<CpuFormatRates>& measured,
                   const std::optional<CpuFormatRates>& contended) {
  const CpuFormatRates s = slowest(measured);
  std::printf("CPU update by state format, against fp32 state's (%s) in the same rounds%s:\n",
              format_rate(RateKind::cpu_update, s.fp32).c_str(),
              measured.size() > 1 ? " (the slowest rank's over the slowest rank's)" : "");
  for (const UpdateFormatInfo& info : kUpdateFormats) {
    std::printf(
        "  %-36s x%.3g (%s)\n", std::string(info.description).c_str(), factors[info.format],
        format_rate(RateKind::cpu_update, s.format[static_cast<std::size_t>(info.format)]).c_str());
  }
  if (!contended) return;
  std::printf("the same while copies run, against fp32 state's (%s):\n",
              format_rate(RateKind::cpu_update, contended->fp32).c_str());
  for (const UpdateFormatInfo& info : kUpdateFormats) {
    const auto i = static_cast<std::size_t>(info.format);
    std::printf("  %-36s x%.3g (%s)\n", std::string(info.description).c_str(), factors.contended[i],
                format_rate(RateKind::cpu_update, contended->format[i]).c_str());
  }
}

}  // namespace

int calibrate_command(int argc, char** argv) {
  MeasureOptions options;
  std::optional<std::filesystem::path> output;
  int ranks = 1;
  int concurrent = 1;  // --ranks: measured here, at once
  bool dry_run = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--long") {
      options.params = std::uint64_t{32} << 20;
      options.repeats = 5;
      options.host_memory_bytes = std::uint64_t{512} << 20;
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
    } else if (arg == "--ranks") {
      concurrent = static_cast<int>(config::parse_int("--ranks", value_of(i, argc, argv), 1, 256));
    } else if (arg == "--dry-run") {
      dry_run = true;
    } else {
      throw std::invalid_argument("unknown argument '" + std::string(arg) +
                                  "' (tide calibrate --help lists them)");
    }
  }
  const std::filesystem::path path = output ? *output : default_calibration_path();
  if (!dry_run) check_calibration_path(path);  // before a measurement it could not save
  if (concurrent > 1 && ranks != 1) {
    throw std::invalid_argument("--ranks measures the ranks itself: leave out --ranks-per-host");
  }
  // Before this process has threads or a driver context: the ranks are forked children.
  RanksMeasured per_rank;
  if (concurrent > 1) {
    per_rank = measure_ranks_at_once(concurrent, options.params, options.repeats);
    ranks = concurrent;
  }

  const driver::CurrentContext context(0);
  Calibration c;
  c.machine = this_machine();
  // The threads one rank updates with: the pool here, or a rank's share when ranks measured.
  c.machine.cpu_threads =
      concurrent > 1 ? static_cast<int>(
                           config::core_share(config::this_topology(), {0, concurrent}).cpus.size())
                     : static_cast<int>(kernels::cpu_pool().size());
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
  // With --ranks the ranks measured the formats (no copies: the file keeps no contended factors,
  // and the planner applies the free ones to both rates).
  std::optional<CpuFormatRates> contended;
  if (per_rank.formats.empty()) {
    per_rank.formats.push_back(
        measure_cpu_formats(options.params, options.repeats, cpu_adam_options(options)));
    contended = measure_cpu_formats_while_copying(options.params, options.repeats,
                                                  cpu_adam_options(options));
  }
  if (!per_rank.rates.empty()) share_measured_rates(c, std::move(per_rank.rates));
  c.cpu_update_factors = cpu_update_factors(per_rank.formats, contended);
  print_factors(c.cpu_update_factors, per_rank.formats, contended);
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
