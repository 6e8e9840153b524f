// The update phase of tide's executor on the stand-in driver: 1e9 parameters (or --params N) in
// subgroups of several sizes, under all-CPU, all-GPU, each fixed K, tide's plan, and the ideal
// bound. The all-GPU line has its ratio to the link's limit ("over_copy_bound": the state and
// gradients in, the state out, both directions at once at the simulated rate), with the chunk
// size of its copies and updates (--gpu-chunk, ExecutorOptions::gpu_chunk_params).
// One JSON line per case:
//   {"bench":"update_phase","subgroup_params":N,"policy":"tide","seconds":X,"predicted_seconds":Y,...}
//
// The machine being simulated: an H100 node, where per rank the CPU updates about 2.2e9 params/s
// and the copies run at about 25 GB/s each way, i.e. the copy path moves 25e9 / 14 = 1.8e9
// params/s, 1/1.2 of the CPU's rate. Here:
// - the CPU update runs on one thread with the scalar kernel (--isa best: the widest one): the
//   stand-in's copies are a real memcpy and then a sleep until the simulated link would be done,
//   and on a small machine the vector kernels on one thread outrun any link whose memcpy leaves
//   the copy threads mostly asleep;
// - the simulated bandwidth keeps the H100 node's ratio to the CPU update's rate (25 GB/s x r /
//   2.2e9), capped at a quarter of the memcpy rate, both rates per second of CPU time, so that a
//   busy machine picks the same link as an idle one;
// - the GPU kernel sleeps at 5e10 params/s instead of running the kernel's host build, which
//   would compete for the cores as a GPU never does.
// Each policy is run --repeats times (default 3) in rounds over all of them and the best kept
// (noise on a shared machine only slows a run down); tide's plan refines its rates from the
// phases it measures, as it does in training.
//
// "ideal": the best any placement could do with the rates measured right before the subgroup
// size's runs, with CPU work and copies perfectly overlapped and the host-to-GPU link carrying
// the CPU subgroups' weights (2 bytes per parameter) as well: min over the GPU's share g of
// max(CPU side, copy-in side, copy-out side). tide's line also gives the CPU rate its best phase
// had ("tide_cpu_params_per_s": a busy machine moves the CPU's rate between measurements).
//
// tide's line has the two ratios that say whether the executor overlaps and the planner chooses
// well (the test suite proves the overlap by order, tests/runtime/executor_overlap_test.cpp;
// how much it is worth is measured here):
// - "over_plan_overlap": the phase against the ideal overlap of the placement it ran, the larger
//   of its two sides perfectly overlapped: the CPU side as the CPU worker took it in that very
//   phase (PhaseReport::cpu_seconds: on a busy machine the CPU's share changes from one second to
//   the next), and the copy side at the measured copy rates. The best of the --repeats phases;
//   "plan_cpu_side_s", "plan_copy_side_s" give its sides, "serial_over_plan_overlap" what running
//   them one after the other would give (the ratio discriminates only when that is well above 1).
// - "over_best_fixed": tide's best phase against the best of all-CPU and every fixed K.
// "within_bounds" compares them with the bounds the executor is held to (1.15 and 1.05, given as
// "over_plan_overlap_bound" and "over_best_fixed_bound"). Stable ratios on a 2-core machine
// shared with other work come from few large subgroups and the scalar kernel, e.g.
// --params 8.4e7 --subgroups 3.5e6 (24 subgroups: phases of about half a second).
//
// --state-dtype bfloat16 runs the moments in bf16 (8 state bytes per parameter copied each way
// instead of 12, and a CPU update that moves 20 bytes instead of 28); --state-dtype both runs fp32
// and bf16 state over the same model in the same rounds, on the same simulated link, and the bf16
// lines add "speedup_vs_fp32_state" (the fp32-state run's best time of the same policy over its).
// --state-dtype q8 runs 8-bit block-wise moments (6 state bytes each way, 16 moved by the CPU
// update), --state-dtype all fp32, bf16 and q8 in the same rounds.
//
// The rates are measured here (fp32 state's) and given to the executor; the CPU update factors of
// the other state formats (planner/cpu_update_factors.h) are the calibration file's, as the
// executor takes them: --calibration FILE, else TIDE_CALIBRATION_FILE or the default path when a
// file is there, else the model's. Each line says which ("cpu_update_factor",
// "cpu_update_contended_factor", "cpu_update_factor_source"). A file measured with the widest
// kernel on every thread need not fit this benchmark's one scalar thread: the tide policy's rate
// refinement corrects the rest, as in training.
//
// Memory: 18 bytes per parameter (fp32 state, bf16 gradient and weight copy in pinned memory,
// bf16 parameters in the stand-in's "device" memory, which is host memory too) plus the GPU
// buffers and as many spare state slots (12 bytes per parameter of a subgroup) in pinned memory.
// With less than that free (75% of MemAvailable), --params shrinks to what fits, said on stderr and
// in every line ("params").
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench/ideal_phase.h"
#include "bench/simulated_gpu.h"
#include "driver/context.h"
#include "driver/memory.h"
#include "io/json_writer.h"
#include "kernels/adam_kernel.h"
#include "kernels/cpu_adam.h"
#include "planner/interleave.h"
#include "planner/measure.h"
#include "planner/rate_sources.h"
#include "runtime/executor.h"
#include "standin/standin.h"

namespace {

using namespace tide;
using namespace tide::planner;
using namespace tide::runtime;

using bench::ideal_seconds;
using bench::sleeping_adam;

template <typename F>
F standin_fn(void* handle, const char* name) {
  return bench::standin_fn<F>(handle, name, "bench_update_phase");
}

// The ideal overlap of the placement a phase ran: its CPU side (the CPU worker's busy time in
// that phase) and its copy side (the host-to-GPU link carries the GPU subgroups' state and
// gradients in and the CPU subgroups' bf16 weights up, the GPU-to-host link the GPU subgroups'
// state out), perfectly overlapped.
struct Sides {
  double cpu = 0, copy = 0;
  double ideal() const { return std::max(cpu, copy); }
  double serial() const { return cpu + copy; }
};
// `state_bytes`: per parameter, 12 (fp32 state) or 8 (bf16 moments).
Sides sides_of(const PhaseReport& phase, const Rates& r, unsigned state_bytes) {
  const auto g = static_cast<double>(phase.ran.gpu_params);
  const auto c = static_cast<double>(phase.ran.cpu_params);
  const double sb = state_bytes;
  Sides s;
  s.cpu = phase.cpu_seconds;
  const double in = g * (sb + 2) + c * 2, out = g * sb;
  s.copy = g > 0 ? std::max(in / r.h2d_duplex, out / r.d2h_duplex) : in / r.h2d;
  return s;
}

constexpr double kOverPlanOverlapBound = 1.15;
constexpr double kOverBestFixedBound = 1.05;

// A state format the benchmark runs: the moments' dtype, or 8-bit block-wise moments.
struct Format {
  const char* name;
  StateOptions options;
  unsigned state_bytes;  // per parameter, copied each way
};

Format state_format(const std::string& name) {
  StateOptions o;
  if (name == "bfloat16") o.state_dtype = kernels::Dtype::kBFloat16;
  if (name == "q8") o.state_format = kernels::StateFormat::kBlockQ8;
  const unsigned bytes = name == "float32" ? 12 : name == "bfloat16" ? 8 : 6;
  return {name == "float32" ? "float32" : name == "bfloat16" ? "bfloat16" : "q8", o, bytes};
}

std::uint64_t mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  double total = 1e9;
  int repeats = 3;
  bool scalar = true;
  bool verbose = false;
  double fixed_gbps = 0;  // 0: from the measured rates
  std::uint64_t gpu_chunk = kDefaultGpuChunkParams;
  std::vector<std::uint64_t> subgroup_sizes = {25'000'000, 50'000'000, 100'000'000};
  std::vector<Format> formats = {state_format("float32")};
  std::optional<std::filesystem::path> calibration_file;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--params") && i + 1 < argc) {
      total = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--isa") && i + 1 < argc &&
               (!std::strcmp(argv[i + 1], "scalar") || !std::strcmp(argv[i + 1], "best"))) {
      scalar = !std::strcmp(argv[++i], "scalar");
    } else if (!std::strcmp(argv[i], "--calibration") && i + 1 < argc) {
      calibration_file = argv[++i];
    } else if (!std::strcmp(argv[i], "--verbose")) {
      verbose = true;
    } else if (!std::strcmp(argv[i], "--gbps") && i + 1 < argc) {
      fixed_gbps = std::atof(argv[++i]);
      if (!(fixed_gbps > 0)) {
        std::fprintf(stderr, "bench_update_phase: --gbps needs a number > 0\n");
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--state-dtype") && i + 1 < argc &&
               (!std::strcmp(argv[i + 1], "float32") || !std::strcmp(argv[i + 1], "bfloat16") ||
                !std::strcmp(argv[i + 1], "q8") || !std::strcmp(argv[i + 1], "both") ||
                !std::strcmp(argv[i + 1], "all"))) {
      const std::string which = argv[++i];
      formats.clear();
      const bool several = which == "both" || which == "all";
      // The others against fp32 state: it runs with them.
      if (several || which == "float32") formats.push_back(state_format("float32"));
      if (several || which == "bfloat16") formats.push_back(state_format("bfloat16"));
      if (which == "all" || which == "q8") formats.push_back(state_format("q8"));
    } else if (!std::strcmp(argv[i], "--gpu-chunk") && i + 1 < argc) {
      gpu_chunk = static_cast<std::uint64_t>(std::atof(argv[++i]));
      if (gpu_chunk == 0 || gpu_chunk % kernels::kQuantBlock != 0) {
        std::fprintf(stderr, "bench_update_phase: --gpu-chunk needs a multiple of %zu\n",
                     kernels::kQuantBlock);
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--subgroups") && i + 1 < argc) {
      subgroup_sizes.clear();
      for (char* t = std::strtok(argv[++i], ","); t; t = std::strtok(nullptr, ",")) {
        subgroup_sizes.push_back(static_cast<std::uint64_t>(std::atof(t)));
      }
    } else {
      std::fprintf(
          stderr,
          "usage: bench_update_phase [--params N (1e9)] [--subgroups S1,S2,...] "
          "[--repeats N (3)] [--isa scalar|best (scalar)] [--gbps G: simulated copies "
          "at G GB/s instead of the H100 ratio] [--gpu-chunk N: parameters per chunk of a GPU "
          "subgroup (4194304)] [--state-dtype float32|bfloat16|q8|both|all "
          "(float32): the moments' format; both: fp32 and bf16, all: and q8, in the same "
          "rounds] [--calibration FILE: its CPU update factors (default: TIDE_CALIBRATION_FILE or "
          "the default path, if there)] [--verbose: "
          "every phase on stderr]\n");
      return 2;
    }
  }
  // The state formats' CPU update factors, as the executor would take them (an invalid file is
  // an error, as there).
  std::optional<CpuUpdateFactors> factors;
  std::string factor_source = "model";
  try {
    const ResolvedRates resolved = resolve_rates(calibration_file);
    if (resolved.calibration_path && resolved.cpu_update_factors().any()) {
      factors = resolved.cpu_update_factors();
      factor_source = "calibration file " + resolved.calibration_path->string();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_update_phase: %s\n", e.what());
    return 2;
  }
  setenv("TIDE_CPU_THREADS", "1", 1);  // before the CPU pool exists
  void* handle = bench::open_standin("bench_update_phase");
  auto set_bandwidth = standin_fn<int (*)(double, double)>(handle, "tide_standin_set_bandwidth");
  auto register_kernel = standin_fn<int (*)(const char*, tide_standin_kernel, size_t)>(
      handle, "tide_standin_register_kernel");

  // What fits: per parameter the bf16 model parameters (2 bytes) and, per state format, its state
  // (12 or 8 bytes), gradient and weight copy (2 + 2) in pinned memory; four GPU buffers of the
  // largest subgroup and four spare state slots.
  const std::uint64_t largest = *std::max_element(subgroup_sizes.begin(), subgroup_sizes.end());
  const double budget = 0.75 * static_cast<double>(mem_available());
  double per_param = 2, per_largest = 0;
  for (const Format& f : formats) {
    const double sb = f.state_bytes;
    per_param += sb + 4;
    per_largest += 4.0 * (sb + 2 + sb);
  }
  const double fits = (budget - per_largest * static_cast<double>(largest)) / per_param;
  if (budget > 0 && fits < total) {
    const double shrunk =
        std::floor(fits / static_cast<double>(largest)) * static_cast<double>(largest);
    std::fprintf(stderr,
                 "bench_update_phase: %.3g parameters need %.1f GB, more than 75%% of the %.1f GB "
                 "available: running %.3g\n",
                 total, (per_param * total + per_largest * static_cast<double>(largest)) / 1e9,
                 budget / 0.75 / 1e9, shrunk);
    total = shrunk;
  }
  if (total < static_cast<double>(largest)) {
    std::fprintf(stderr, "bench_update_phase: not enough memory for one subgroup of each size\n");
    return 1;
  }

  const driver::CurrentContext context(0);
  register_kernel(kernels::kAdamKernel, &sleeping_adam, sizeof(kernels::AdamKernelParams));
  register_kernel(kernels::kAdamQ8Kernel, &sleeping_adam, sizeof(kernels::AdamKernelParams));
  kernels::CpuAdamOptions cpu_options{.threads = 1};
  if (scalar) {
    cpu_options.force_isa = true;
    cpu_options.isa = kernels::CpuIsa::kScalar;
  }
  const auto [cpu_per_s, memcpy_per_s] = measure_cpu_cost(std::uint64_t{4} << 20, cpu_options);
  const double h100_gbps = 25.0 * cpu_per_s / 2.2e9;
  // A fixed link (--gbps) compares two builds whose kernels run at different speeds (code
  // placement alone moved the scalar kernel by 30% between two builds of the same source).
  const double gbps = fixed_gbps > 0 ? fixed_gbps : std::min(h100_gbps, memcpy_per_s / 4 / 1e9);
  set_bandwidth(gbps, gbps);
  std::fprintf(stderr,
               "machine: CPU update %.3g params/s (1 thread, %s kernel) and memcpy %.2f GB/s per "
               "CPU second; simulated copies %.2f GB/s (H100 ratio: %.2f GB/s)\n",
               cpu_per_s, scalar ? "scalar" : "widest", memcpy_per_s / 1e9, gbps, h100_gbps);

  MeasureOptions m;
  m.params = std::uint64_t{8} << 20;
  m.cpu_threads = 1;
  if (scalar) m.cpu_isa = kernels::CpuIsa::kScalar;
  m.host_memory_bytes = std::uint64_t{64} << 20;  // 256 MiB in all: past the caches, quickly
  const std::uint64_t device_memory = std::uint64_t{80} << 30;
  for (std::uint64_t size : subgroup_sizes) {
    const auto n = static_cast<std::size_t>(std::max(1.0, total / static_cast<double>(size)));
    std::vector<SubgroupSpec> specs(n);
    std::vector<driver::DeviceBuffer> params;
    for (std::size_t i = 0; i < n; ++i) {
      params.emplace_back(size * 2);
      specs[i].params = size;
      specs[i].slices.push_back(ParamSlice{0, size, params.back().get()});
    }
    const Rates rates = measure_rates(m);  // right before this size's runs (fp32 state)
    const double w = static_cast<double>(n * size);
    const std::uint64_t headroom = device_memory / 2;
    kernels::AdamHyper hyper;

    struct Best {
      double seconds = 1e300;
      double predicted = 0;
      double cpu_rate = 0;  // params/s the CPU side had in that phase
      std::size_t gpu = 0, buffers = 0;
      double over_overlap = 1e300;  // the best phase against its placement's ideal overlap
      Sides sides;                  // of that phase
    };
    // One optimizer state and executor per state format, over the same model parameters, run in
    // the same rounds: their phases see the same load and the same simulated link.
    struct Setup {
      Format format;
      std::unique_ptr<OptimizerState> state;
      std::unique_ptr<Executor> executor;
      std::map<std::string, Best> best;
    };
    std::vector<Setup> setups;
    for (const Format& format : formats) {
      Setup setup{format, std::make_unique<OptimizerState>(specs, format.options), nullptr, {}};
      ExecutorOptions options;
      options.rates = rates;
      options.cpu_update_factors = factors;
      options.cpu_threads = 1;
      options.gpu_chunk_params = gpu_chunk;
      if (scalar) options.cpu_isa = kernels::CpuIsa::kScalar;
      setup.executor = std::make_unique<Executor>(*setup.state, options);
      setups.push_back(std::move(setup));
    }
    std::vector<Policy> policies = {Policy::all_cpu(), Policy::all_gpu()};
    for (std::size_t k = 2; k <= std::min<std::size_t>(n, 8); ++k)
      policies.push_back(Policy::every(k));
    policies.push_back(Policy::automatic_policy());
    for (Setup& setup : setups) setup.executor->run(hyper, Policy::all_cpu(), headroom);  // pages
    for (int round = 0; round < repeats; ++round) {
      for (Setup& setup : setups) {
        for (const Policy& p : policies) {
          const PhaseReport& r = setup.executor->run(hyper, p, headroom);
          if (verbose) {
            std::string gpu;
            for (std::size_t s : r.ran.gpu_order)
              gpu += (gpu.empty() ? "" : ",") + std::to_string(s);
            std::fprintf(
                stderr,
                "%s, %s state: %.3f s (predicted %.3f s: CPU side %.3f, GPU side %.3f, link "
                "%.3f), CPU busy %.3f s (%.3g params/s), GPU [%s], %zu buffers\n",
                policy_name(p).c_str(), setup.format.name, r.seconds, r.ran.predicted.phase_s,
                r.ran.predicted.cpu_side_s, r.ran.predicted.gpu_side_s, r.ran.predicted.link_s,
                r.cpu_seconds,
                r.cpu_seconds > 0 ? static_cast<double>(r.ran.cpu_params) / r.cpu_seconds : 0,
                gpu.c_str(), r.ran.buffers);
            for (std::size_t s : r.ran.gpu_order) {
              const SubgroupTiming& t = r.timings[s];
              std::fprintf(stderr,
                           "  GPU subgroup %zu: copy-in %.3f s, update %.3f s, copy-out %.3f s\n",
                           s, t.h2d_s, t.gpu_update_s, t.d2h_s);
            }
          }
          Best& b = setup.best[policy_name(p)];
          const Sides sides = sides_of(r, rates, setup.state->state_bytes());
          if (r.seconds / sides.ideal() < b.over_overlap) {
            b.over_overlap = r.seconds / sides.ideal();
            b.sides = sides;
          }
          if (r.seconds < b.seconds) {
            b.seconds = r.seconds;
            b.predicted = r.ran.predicted.phase_s;
            b.cpu_rate =
                r.cpu_seconds > 0 ? static_cast<double>(r.ran.cpu_params) / r.cpu_seconds : 0;
            b.gpu = r.ran.gpu_order.size();
            b.buffers = r.ran.buffers;
          }
        }
      }
    }
    const Setup* fp32 = nullptr;
    for (const Setup& setup : setups) {
      if (setup.format.state_bytes == 12) fp32 = &setup;
    }
    for (Setup& setup : setups) {
      auto emit = [&](const std::string& policy, const Best& b, const std::string& extra) {
        // Against the fp32-state run of the same policy, in the same rounds, on the same link.
        std::string versus;
        if (fp32 != nullptr && &setup != fp32) {
          const auto it = fp32->best.find(policy == "all_cpu" ? "cpu"
                                          : policy == "tide"  ? "auto"
                                                              : policy);
          if (it != fp32->best.end() && b.seconds > 0) {
            char text[64];
            std::snprintf(text, sizeof text, ",\"speedup_vs_fp32_state\":%.3f",
                          it->second.seconds / b.seconds);
            versus = text;
          }
        }
        const Footprint footprint = setup.executor->footprint(false);
        std::printf(
            "{\"bench\":\"update_phase\",\"subgroup_params\":%llu,\"policy\":\"%s\","
            "\"state_dtype\":\"%s\",\"state_bytes_per_param\":%u,"
            "\"cpu_update_factor\":%.4g,\"cpu_update_contended_factor\":%.4g,"
            "\"cpu_update_factor_source\":%s,"
            "\"seconds\":%.4f,\"predicted_seconds\":%.4f,\"subgroups\":%zu,"
            "\"gpu_subgroups\":%zu,\"buffers\":%zu,\"params\":%.3g,"
            "\"cpu_update_params_per_s\":%.3g,\"cpu_update_contended_params_per_s\":%.3g,"
            "\"copy_gbps\":%.2f,\"cpu_isa\":\"%s\"%s%s,"
            "\"machine\":\"stand-in, 1 CPU update thread, simulated copies and GPU\"}\n",
            static_cast<unsigned long long>(size), policy.c_str(), setup.format.name,
            setup.state->state_bytes(), footprint.cpu_update_scale(),
            footprint.cpu_update_contended_scale(),
            io::json::quote(footprint.update_format() && footprint.cpu_update_calibrated()
                                ? factor_source
                            : footprint.update_format() ? "model"
                                                        : "fp32 state (1)")
                .c_str(),
            b.seconds, b.predicted, n, b.gpu, b.buffers, w, rates.cpu_update,
            rates.cpu_update_contended, gbps, scalar ? "scalar" : "widest", versus.c_str(),
            extra.c_str());
        std::fflush(stdout);
      };
      double best_fixed = 1e300;
      for (const Policy& p : policies) {
        const std::string name = policy_name(p);
        if (p.kind == Policy::Kind::automatic) continue;
        best_fixed = std::min(best_fixed, setup.best[name].seconds);
        std::string extra;
        if (p.kind == Policy::Kind::gpu) {
          // The link's limit: the state and gradients in and the state out, both directions at
          // once at the simulated rate, so the copy-in's bytes bound it.
          const double sb = setup.state->state_bytes();
          const double bound = w * (sb + 2) / (gbps * 1e9);
          char text[160];
          std::snprintf(text, sizeof text,
                        ",\"copy_bound_seconds\":%.4f,\"over_copy_bound\":%.3f,"
                        "\"gpu_chunk_params\":%llu",
                        bound, setup.best[name].seconds / bound,
                        static_cast<unsigned long long>(gpu_chunk));
          extra = text;
        }
        emit(p.kind == Policy::Kind::cpu ? "all_cpu" : name, setup.best[name], extra);
      }
      const Best& tide = setup.best["auto"];
      // The measured CPU rate is fp32 state's. Another format's: as its all-CPU phases ran
      // against fp32 state's in the same rounds when both ran (the kernel here is one scalar
      // thread, not bandwidth-bound: bf16 moments cost conversions and save little), else as the
      // executor assumes (Footprint::cpu_update_contended_scale: calibrated, else the bytes' ratio,
      // 8-bit moments' 0.35).
      double scale = setup.executor->footprint(false).cpu_update_contended_scale();
      if (fp32 != nullptr && &setup != fp32) {
        scale = fp32->best.at("cpu").seconds / setup.best.at("cpu").seconds;
      }
      const double ideal = ideal_seconds(w, rates.cpu_update_contended * scale, rates, 2,
                                         setup.state->state_bytes());
      const double over_best_fixed = tide.seconds / best_fixed;
      char extra[512];
      std::snprintf(
          extra, sizeof extra,
          ",\"over_ideal\":%.3f,\"over_best_fixed\":%.3f,\"tide_cpu_params_per_s\":%.3g,"
          "\"over_plan_overlap\":%.3f,\"plan_cpu_side_s\":%.4f,\"plan_copy_side_s\":%.4f,"
          "\"serial_over_plan_overlap\":%.3f,\"over_plan_overlap_bound\":%.2f,"
          "\"over_best_fixed_bound\":%.2f,\"within_bounds\":%s",
          tide.seconds / ideal, over_best_fixed, tide.cpu_rate, tide.over_overlap, tide.sides.cpu,
          tide.sides.copy, tide.sides.serial() / tide.sides.ideal(), kOverPlanOverlapBound,
          kOverBestFixedBound,
          tide.over_overlap <= kOverPlanOverlapBound && over_best_fixed <= kOverBestFixedBound
              ? "true"
              : "false");
      emit("tide", tide, extra);
      Best bound;
      bound.seconds = bound.predicted = ideal;
      emit("ideal", bound, "");
    }
  }
  return 0;
}
