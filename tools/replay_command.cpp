// `tide replay`: runs an allocation-event trace (allocator/telemetry/trace.h) back through the
// device caching allocator, on the driver tide loads (the stand-in driver on a machine without a
// GPU), and prints what it took as one JSON line: peaks of live, requested and reserved bytes,
// driver allocation calls (after the first and second iterations too), failed allocations, time.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "allocator/device/caching_allocator.h"
#include "allocator/device/trace_replay.h"
#include "allocator/telemetry/synthetic_trace.h"
#include "allocator/telemetry/trace.h"
#include "config/env.h"
#include "io/json_writer.h"
#include "tools/command.h"

namespace tide::tools {
namespace {

constexpr const char* kUsage =
    "usage: tide replay TRACE [options]\n"
    "       tide replay --synthetic SHAPE [--iterations N] [--no-marks] [options]\n"
    "\n"
    "Runs an allocation-event trace (tide_alloc_trace_start/stop, tide.torch.start_trace) back\n"
    "through tide's device caching allocator (configured by the TIDE_ALLOC_* variables) and\n"
    "prints one JSON line. --synthetic generates a transformer-shaped training trace instead:\n"
    "SHAPE is gpt-tiny, gpt2-small, gpt2-medium or gpt-1.3b.\n"
    "\n"
    "options:\n"
    "  --device N         the device to replay on (default: the trace's, else 0)\n"
    "  --save PATH        write the (generated) trace to PATH\n"
    "  --timeline PATH    write the timeline with its phases as Chrome trace JSON (Perfetto)\n"
    "  --iterations N     synthetic: iterations, 1 to 100000 (default 20)\n"
    "  --jitter F         synthetic: vary step times and sequence lengths by up to F, 0 <= F <\n"
    "                     0.5 (default 0)\n"
    "  --no-marks         synthetic: no phase marks (phases are detected from the curve)\n"
    "\n"
    "A trace is checked before it runs (allocator/telemetry/trace.h): unsigned integers only, at "
    "most 256\n"
    "streams and 2^26 events, no free or record of an id that is not live. Exit status: 0, or\n"
    "1 with a message (a bad argument or trace, or allocations that failed).\n";

constexpr std::int64_t kMaxIterations = 100000;

double ratio(std::uint64_t a, std::uint64_t b) {
  return b == 0 ? 0.0 : static_cast<double>(a) / static_cast<double>(b);
}

}  // namespace

int replay_command(int argc, char** argv) {
  std::string path;
  std::string synthetic;
  std::string save;
  std::string timeline;
  std::optional<int> device;
  allocator::telemetry::SyntheticOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) throw std::invalid_argument(std::string(arg) + " needs a value");
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--synthetic") {
      synthetic = value();
    } else if (arg == "--iterations") {
      options.iterations = static_cast<int>(config::parse_int(arg, value(), 1, kMaxIterations));
    } else if (arg == "--jitter") {
      const double j = config::parse_double(arg, value(), 0, 0.5);
      if (j >= 0.5) throw std::invalid_argument("--jitter expects 0 <= F < 0.5, not 0.5");
      options.time_jitter = j;
      options.size_jitter = j;
    } else if (arg == "--no-marks") {
      options.marks = false;
    } else if (arg == "--device") {
      device = static_cast<int>(config::parse_int(
          arg, value(), 0, static_cast<std::int64_t>(allocator::telemetry::kMaxTraceDevice)));
    } else if (arg == "--save") {
      save = value();
    } else if (arg == "--timeline") {
      timeline = value();
    } else if (!arg.empty() && arg[0] == '-') {
      std::fprintf(stderr, "tide replay: unknown option '%s'\n\n%s", argv[i], kUsage);
      return 2;
    } else if (path.empty()) {
      path = argv[i];
    } else {
      std::fprintf(stderr, "tide replay: one trace at a time\n\n%s", kUsage);
      return 2;
    }
  }
  if (path.empty() == synthetic.empty()) {
    std::fprintf(stderr, "tide replay: give a TRACE file or --synthetic SHAPE\n\n%s", kUsage);
    return 2;
  }

  allocator::telemetry::Trace trace;
  std::string name = path;
  if (!synthetic.empty()) {
    trace = allocator::telemetry::generate_transformer_trace(
                allocator::telemetry::shape_named(synthetic), options)
                .trace;
    name = synthetic;
  } else {
    trace = allocator::telemetry::load_trace(path);
  }
  if (!save.empty()) allocator::telemetry::save_trace(save, trace);

  allocator::device::CachingAllocator alloc(device.value_or(trace.device));
  const allocator::device::ReplayResult r = allocator::device::replay_trace(trace, alloc);
  if (!timeline.empty()) alloc.export_chrome_trace(timeline);

  const auto& ends = r.device_allocs_at_end;
  const std::uint64_t after1 = !ends.empty() ? r.device_allocs - ends[0] : 0;
  const std::uint64_t after2 = ends.size() >= 2 ? r.device_allocs - ends[1] : 0;
  const std::uint64_t allocs_after1 =
      r.allocations_at_end.empty() ? 0 : r.allocations - r.allocations_at_end[0];
  std::printf(
      "{\"trace\":%s,\"events\":%llu,\"allocations\":%llu,\"failed_allocations\":%llu,"
      "\"unknown_ids\":%llu,\"iterations\":%zu,\"peak_live_bytes\":%llu,"
      "\"peak_requested_bytes\":%llu,\"peak_reserved_bytes\":%llu,"
      "\"peak_reserved_over_live\":%.4f,\"peak_reserved_over_requested\":%.4f,"
      "\"driver_allocs\":%llu,\"driver_allocs_after_iter1\":%llu,"
      "\"driver_allocs_after_iter2\":%llu,\"driver_allocs_per_1000_after_iter1\":%.3f,"
      "\"growable\":%s,\"seconds\":%.4f}\n",
      io::json::quote(name).c_str(), static_cast<unsigned long long>(r.events),
      static_cast<unsigned long long>(r.allocations),
      static_cast<unsigned long long>(r.failed_allocations),
      static_cast<unsigned long long>(r.unknown_ids), ends.size(),
      static_cast<unsigned long long>(r.peak_live),
      static_cast<unsigned long long>(r.peak_requested),
      static_cast<unsigned long long>(r.peak_reserved), ratio(r.peak_reserved, r.peak_live),
      ratio(r.peak_reserved, r.peak_requested), static_cast<unsigned long long>(r.device_allocs),
      static_cast<unsigned long long>(after1), static_cast<unsigned long long>(after2),
      1000.0 * ratio(after1, allocs_after1), alloc.stats().growable != 0 ? "true" : "false",
      r.seconds);
  if (r.failed_allocations != 0) {
    std::fprintf(stderr, "tide replay: %llu of %llu allocations failed (out of device memory)\n",
                 static_cast<unsigned long long>(r.failed_allocations),
                 static_cast<unsigned long long>(r.allocations));
    return 1;
  }
  return 0;
}

}  // namespace tide::tools
