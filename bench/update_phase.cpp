// The update phase of tide's executor on the stand-in driver: 1e9 parameters (or --params N) in
// subgroups of several sizes, under all-CPU, each fixed K, tide's plan, and the ideal bound.
// One JSON line per case:
//   {"bench":"update_phase","subgroup_params":N,"policy":"tide","seconds":X,"predicted_seconds":Y,...}
//
// The machine being simulated: an H100 node, where per rank the CPU updates about 2.2e9 params/s
// and the copies run at about 25 GB/s each way, i.e. the copy path moves 25e9 / 14 = 1.8e9
// params/s, 1/1.2 of the CPU's rate. Here the CPU update runs on one thread (TIDE_CPU_THREADS=1;
// the second core plays the GPU's copy engines: the stand-in's stream threads memcpy behind each
// simulated copy), its rate r is measured, and the simulated copy bandwidth is scaled to keep the
// H100 node's ratio: 25 GB/s x r / 2.2e9, capped at half the stand-in's memcpy rate so that its
// copy threads still sleep half the time as a DMA engine would. The GPU kernel is simulated too
// (a sleep at 5e10 params/s instead of the host twin's arithmetic, which would compete for the
// cores as a GPU never does).
//
// "ideal": the best any placement could do with the measured rates, with CPU work and copies
// perfectly overlapped and the host-to-GPU link carrying the CPU subgroups' weights (2 bytes per
// parameter) as well: min over the GPU's share g of max(CPU side, copy-in side, copy-out side).
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "driver/context.h"
#include "driver/memory.h"
#include "kernels/adam_kernel.h"
#include "scheduler/executor.h"
#include "scheduler/interleave.h"
#include "scheduler/measure.h"
#include "standin/standin.h"

namespace {

using namespace tide;
using namespace tide::scheduler;

double g_gpu_rate = 5e10;

void sleeping_adam(const tide_standin_grid*, void** params) {
  const auto* p = static_cast<const kernels::AdamKernelParams*>(params[0]);
  std::uint64_t n = 0;
  for (std::uint32_t i = 0; i < p->subgroup_count; ++i) n += p->subgroups[i].count;
  std::this_thread::sleep_for(std::chrono::duration<double>(static_cast<double>(n) / g_gpu_rate));
}

template <typename F>
F standin_fn(void* handle, const char* name) {
  auto* f = reinterpret_cast<F>(dlsym(handle, name));
  if (f == nullptr) {
    std::fprintf(stderr,
                 "bench_update_phase: needs the stand-in driver (TIDE_CUDA_DRIVER); no %s\n", name);
    std::exit(2);
  }
  return f;
}

double ideal_seconds(double w, const Rates& r, double upload_bytes) {
  double best = 1e300;
  for (int i = 0; i <= 1000; ++i) {
    const double g = w * i / 1000.0, c = w - g;
    const double t = std::max({c / r.cpu_update_contended,
                               (14 * g + upload_bytes * c) / r.h2d_duplex, 12 * g / r.d2h_duplex});
    best = std::min(best, t);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  double total = 1e9;
  int repeats = 2;
  std::vector<std::uint64_t> subgroup_sizes = {25'000'000, 50'000'000, 100'000'000};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--params") && i + 1 < argc) {
      total = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--subgroups") && i + 1 < argc) {
      subgroup_sizes.clear();
      for (char* t = std::strtok(argv[++i], ","); t; t = std::strtok(nullptr, ",")) {
        subgroup_sizes.push_back(static_cast<std::uint64_t>(std::atof(t)));
      }
    } else {
      std::fprintf(stderr,
                   "usage: bench_update_phase [--params N (1e9)] [--subgroups S1,S2,...] "
                   "[--repeats N (2)]\n");
      return 2;
    }
  }
  setenv("TIDE_CPU_THREADS", "1", 1);  // before the CPU pool exists
  const char* path = std::getenv("TIDE_CUDA_DRIVER");
  void* handle = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (handle == nullptr) {
    std::fprintf(stderr, "bench_update_phase: set TIDE_CUDA_DRIVER to the stand-in driver\n");
    return 2;
  }
  auto set_bandwidth = standin_fn<int (*)(double, double)>(handle, "tide_standin_set_bandwidth");
  auto register_kernel = standin_fn<int (*)(const char*, tide_standin_kernel, size_t)>(
      handle, "tide_standin_register_kernel");

  driver::PrimaryContext context(0);
  register_kernel(kernels::kAdamKernel, &sleeping_adam, sizeof(kernels::AdamKernelParams));
  MeasureOptions m;
  m.params = std::uint64_t{8} << 20;
  const Rates unlimited = measure_rates(m);
  const double h100_gbps = 25.0 * unlimited.cpu_update / 2.2e9;
  const double memcpy_gbps = std::min(unlimited.h2d, unlimited.d2h) / 1e9;
  const double gbps = std::min(h100_gbps, memcpy_gbps / 2);
  set_bandwidth(gbps, gbps);
  const Rates rates = measure_rates(m);
  std::fprintf(stderr,
               "machine: CPU update %.3g params/s (1 thread), stand-in memcpy %.2f GB/s; simulated "
               "copies %.2f GB/s (H100 ratio would be %.2f GB/s)\n",
               unlimited.cpu_update, memcpy_gbps, gbps, h100_gbps);

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
    OptimizerState state(std::move(specs), StateOptions{});
    ExecutorOptions options;
    options.rates = rates;
    options.refine = false;  // every policy planned from the same rates
    Executor executor(state, options);
    const double w = static_cast<double>(n * size);
    const std::uint64_t headroom = device_memory / 2;
    auto emit = [&](const std::string& policy, double seconds, double predicted, std::size_t gpu,
                    std::size_t buffers) {
      std::printf(
          "{\"bench\":\"update_phase\",\"subgroup_params\":%llu,\"policy\":\"%s\","
          "\"seconds\":%.4f,\"predicted_seconds\":%.4f,\"subgroups\":%zu,"
          "\"gpu_subgroups\":%zu,\"buffers\":%zu,\"params\":%.3g,"
          "\"cpu_update_params_per_s\":%.3g,\"copy_gbps\":%.2f,"
          "\"machine\":\"stand-in, 1 CPU update thread, simulated copies\"}\n",
          static_cast<unsigned long long>(size), policy.c_str(), seconds, predicted, n, gpu,
          buffers, w, rates.cpu_update, gbps);
      std::fflush(stdout);
    };
    kernels::AdamHyper hyper;
    auto run = [&](const Policy& p) {
      double best = 1e300;
      const PhaseReport* last = nullptr;
      for (int i = 0; i < repeats; ++i) {
        const PhaseReport& r = executor.run(hyper, p, headroom);
        best = std::min(best, r.seconds);
        last = &r;
      }
      emit(p.kind == Policy::Kind::automatic ? "tide"
           : p.kind == Policy::Kind::cpu     ? "all_cpu"
                                             : policy_name(p),
           best, last->ran.predicted.phase_s, last->ran.gpu_order.size(), last->ran.buffers);
    };
    executor.run(hyper, Policy::all_cpu(), headroom);  // warm: pages
    run(Policy::all_cpu());
    for (std::size_t k = 2; k <= std::min<std::size_t>(n, 8); ++k) run(Policy::every(k));
    run(Policy::automatic_policy());
    emit("ideal", ideal_seconds(w, rates, 2), ideal_seconds(w, rates, 2), 0, 0);
  }
  return 0;
}
