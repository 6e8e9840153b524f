// Ranks that share a node, each running tide's update phase at the same time on the stand-in
// driver with simulated links (one per rank, as each GPU has its own). N local ranks (--ranks,
// default 2) are processes, as torchrun starts them. Cases, each run in rounds (interleaved, the
// best round kept: noise only slows a round down):
//   node_aware  LOCAL_RANK / LOCAL_WORLD_SIZE set: each rank's CPU pool is its share of the cores
//               (disjoint, pinned), and it plans with per-rank rates measured while all ranks
//               ran at once (what `tide calibrate --ranks N` records)
//   unaware     today's behaviour without them: every rank's pool is sized for the whole machine,
//               and it plans with rates a rank measured alone
//   all_cpu     node-aware pools, every subgroup on the CPU
//   share_unpinned  node_aware with TIDE_CPU_PIN=0: the share's pool size and rates, the threads
//               placed by the kernel (what pinning costs or saves)
// One JSON line per case: each rank's update-phase time, the node's phase (the slowest rank's),
// the node's aggregate params/s against the node's memory-bandwidth bound (tide_membw's best
// kernel, over the 28 bytes an fp32-state Adam update with bf16 gradient and weight copy moves per
// parameter) and against the node's ideal (bench/ideal_phase.h at the per-rank rates measured
// with all ranks running). Then the performance model's prediction for 2, 4 and 8 ranks: node-aware
// plan against the plan a rank that assumes it is alone makes (evaluated at the rates it really
// gets) and all-CPU.
//
// As in bench_update_phase, the CPU update uses the scalar kernel (--isa best: the widest) and the
// simulated link keeps the H100 node's ratio to a rank's CPU rate (25 GB/s against 2.2e9
// params/s), capped at a quarter of the memcpy rate, both per second of CPU time; the GPU kernel
// sleeps at 5e10 params/s.
//
// Memory: about 18 bytes per parameter per rank (fp32 state, bf16 gradient and weight copy in
// pinned memory, bf16 parameters in the stand-in's device memory): 2.9 GB at the defaults.
//
// usage: bench_node_update [--ranks N (2)] [--params P per rank (8e7)] [--subgroup-params S
//        (4e6)] [--rounds R (3)] [--isa scalar|best (scalar)]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench/ideal_phase.h"
#include "bench/membw_runner.h"
#include "bench/simulated_gpu.h"
#include "config/node.h"
#include "driver/context.h"
#include "driver/memory.h"
#include "kernels/adam_kernel.h"
#include "kernels/cpu_adam.h"
#include "planner/measure.h"
#include "planner/node_rates.h"
#include "planner/planner.h"
#include "planner/rank_processes.h"
#include "runtime/executor.h"

namespace {

using namespace tide;
using namespace tide::planner;
using namespace tide::runtime;

constexpr const char* kName = "bench_node_update";
constexpr double kAdamBytesPerParam = 28;  // fp32 p, m, v read and written, bf16 g in, copy out

struct Settings {
  int ranks = 2;
  double params = 8e7;  // per rank
  double subgroup = 4e6;
  int rounds = 3;
  bool scalar = true;
};

// tide_membw's best bandwidth over every core, GB/s; 0 if it cannot run.
double node_membw_gbps() {
  std::string line;
  return bench::run_membw(
      "--threads " + std::to_string(config::this_topology().cpu_count()) + " --mib 128 --reps 4",
      line);
}

// In a rank: a context, then the stand-in's simulated link and GPU kernel.
std::unique_ptr<driver::CurrentContext> open_device(double gbps) {
  void* handle = bench::open_standin(kName);
  auto set_bandwidth =
      bench::standin_fn<int (*)(double, double)>(handle, "tide_standin_set_bandwidth", kName);
  auto register_kernel = bench::standin_fn<int (*)(const char*, tide_standin_kernel, size_t)>(
      handle, "tide_standin_register_kernel", kName);
  auto context = std::make_unique<driver::CurrentContext>(0);
  // After the driver's initialisation, which sets the links from TIDE_STANDIN_*_GBPS.
  if (gbps > 0) set_bandwidth(gbps, gbps);
  register_kernel(kernels::kAdamKernel, &bench::sleeping_adam, sizeof(kernels::AdamKernelParams));
  return context;
}

std::string rates_text(const Rates& r) {
  std::ostringstream out;
  out.precision(17);
  for (const RateInfo& info : rate_infos()) out << r.*info.member << ' ';
  return out.str();
}

Rates rates_from(const std::string& text) {
  std::istringstream in(text);
  Rates r;
  for (const RateInfo& info : rate_infos()) in >> r.*info.member;
  return r;
}

// Each rate's smallest over the ranks: the slowest rank sets the node's phase.
Rates slowest(const std::vector<std::string>& lines) {
  Rates out = rates_from(lines.front());
  for (const std::string& line : lines) {
    const Rates r = rates_from(line);
    for (const RateInfo& info : rate_infos()) {
      out.*info.member = std::min(out.*info.member, r.*info.member);
    }
  }
  return out;
}

struct Case {
  const char* name = "";
  bool node_aware = false;
  bool all_cpu = false;
  bool pin = true;  // TIDE_CPU_PIN
  Rates rates;
  // The best round: the slowest rank's phase, and each rank's phase in that round.
  double phase = 1e300;
  std::vector<double> rank_seconds;
  double predicted = 0;
  std::size_t gpu_subgroups = 0;
};

// One round of a case: every rank builds its optimizer state, warms it, and runs two timed
// update phases at the same time as the others. Returns, per rank, "seconds seconds predicted gpu".
std::vector<std::string> run_case(const Settings& s, const Case& c, double gbps) {
  return run_ranks(s.ranks, c.node_aware, [&](int, const RankBarrier& barrier) {
    setenv("TIDE_CPU_PIN", c.pin ? "1" : "0", 1);
    const auto context = open_device(gbps);
    const auto n = static_cast<std::size_t>(std::max(1.0, s.params / s.subgroup));
    const auto size = static_cast<std::uint64_t>(s.subgroup);
    std::vector<driver::DeviceBuffer> params;
    std::vector<SubgroupSpec> specs(n);
    for (std::size_t i = 0; i < n; ++i) {
      params.emplace_back(size * 2);
      specs[i].params = size;
      specs[i].slices.push_back(ParamSlice{0, size, params.back().get()});
    }
    OptimizerState state(specs, StateOptions{});
    ExecutorOptions options;
    options.rates = c.rates;
    if (s.scalar) options.cpu_isa = kernels::CpuIsa::kScalar;
    Executor executor(state, options);
    const kernels::AdamHyper hyper;
    const std::uint64_t headroom = std::uint64_t{40} << 30;
    const Policy policy = c.all_cpu ? Policy::all_cpu() : Policy::automatic_policy();
    executor.run(hyper, Policy::all_cpu(), headroom);  // touches the pages
    std::ostringstream out;
    double predicted = 0;
    std::size_t gpu = 0;
    for (int phase = 0; phase < 2; ++phase) {
      barrier();
      const PhaseReport& r = executor.run(hyper, policy, headroom);
      out << r.seconds << ' ';
      predicted = r.ran.predicted.phase_s;
      gpu = r.ran.gpu_order.size();
    }
    out << predicted << ' ' << gpu;
    return out.str();
  });
}

void record(Case& c, const std::vector<std::string>& lines) {
  std::vector<std::vector<double>> seconds;
  std::vector<double> predicted;
  std::vector<std::size_t> gpu;
  for (const std::string& line : lines) {
    std::istringstream in(line);
    double a = 0, b = 0, p = 0;
    std::size_t g = 0;
    in >> a >> b >> p >> g;
    seconds.push_back({a, b});
    predicted.push_back(p);
    gpu.push_back(g);
  }
  for (std::size_t phase = 0; phase < 2; ++phase) {
    double node = 0;
    for (const auto& rank : seconds) node = std::max(node, rank[phase]);
    if (node < c.phase) {
      c.phase = node;
      c.rank_seconds.clear();
      for (const auto& rank : seconds) c.rank_seconds.push_back(rank[phase]);
      c.predicted = predicted[0];
      c.gpu_subgroups = gpu[0];
    }
  }
}

// The model at `ranks` ranks per node: the per-rank rates measured at `measured` shared out.
void emit_model(const Settings& s, int measured, const Rates& node, const Rates& alone, int ranks) {
  Calibration calibration;
  calibration.machine.ranks_per_host = measured;
  ResolvedRates resolved;
  resolved.rates = node;
  resolved.source.fill(RateSource::calibration);
  resolved.calibration = calibration;
  const Rates shared = share_for_node(resolved, ranks).rates;
  Workload w;
  w.headroom_bytes = std::uint64_t{40} << 30;
  for (double left = s.params; left >= s.subgroup; left -= s.subgroup) {
    w.subgroup_params.push_back(static_cast<std::uint64_t>(s.subgroup));
  }
  const Plan aware = plan(w, shared);
  const Plan believed = plan(w, alone);  // what a rank that assumes it is alone picks
  const Plan unaware = evaluate(w, shared, Placement{believed.gpu_order, believed.buffers});
  const Plan cpu = all_cpu_plan(w, shared);
  std::printf(
      "{\"bench\":\"node_update\",\"case\":\"model\",\"ranks\":%d,\"params_per_rank\":%.3g,"
      "\"cpu_update_per_rank\":%.3g,\"node_aware_s\":%.4f,\"node_aware_gpu_subgroups\":%zu,"
      "\"unaware_s\":%.4f,\"unaware_gpu_subgroups\":%zu,\"all_cpu_s\":%.4f,"
      "\"unaware_over_node_aware\":%.3f,\"all_cpu_over_node_aware\":%.3f,"
      "\"note\":\"performance model: rates measured with %d ranks shared out to %d; unaware is "
      "the plan made with rates measured alone, at the rates it gets (oversubscription not "
      "modelled)\"}\n",
      ranks, s.params, shared.cpu_update, aware.predicted.phase_s, aware.gpu_subgroups(),
      unaware.predicted.phase_s, unaware.gpu_subgroups(), cpu.predicted.phase_s,
      unaware.predicted.phase_s / aware.predicted.phase_s,
      cpu.predicted.phase_s / aware.predicted.phase_s, measured, ranks);
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const bool value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--ranks") && value) {
      s.ranks = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--params") && value) {
      s.params = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--subgroup-params") && value) {
      s.subgroup = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--rounds") && value) {
      s.rounds = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--isa") && value &&
               (!std::strcmp(argv[i + 1], "scalar") || !std::strcmp(argv[i + 1], "best"))) {
      s.scalar = !std::strcmp(argv[++i], "scalar");
    } else {
      std::fprintf(stderr,
                   "usage: %s [--ranks N (2)] [--params P per rank (8e7)] [--subgroup-params S "
                   "(4e6)] [--rounds R (3)] [--isa scalar|best (scalar)]\n",
                   kName);
      return 2;
    }
  }
  if (s.ranks < 1 || s.ranks > 64 || s.rounds < 1 || s.rounds > 100 || !(s.subgroup >= 1024) ||
      !(s.params >= s.subgroup) || s.params > 1e10) {
    std::fprintf(stderr, "%s: out of range (1-64 ranks, 1-100 rounds, subgroups >= 1024)\n", kName);
    return 2;
  }
  // Every rank's pool from its share (node-aware) or the machine (unaware), never a fixed size.
  unsetenv("TIDE_CPU_THREADS");
  const config::Topology topology = config::this_topology();
  const std::size_t share = config::core_share(topology, {0, s.ranks}).cpus.size();
  const double membw = node_membw_gbps();

  kernels::CpuAdamOptions one{.threads = 1};
  if (s.scalar) {
    one.force_isa = true;
    one.isa = kernels::CpuIsa::kScalar;
  }
  // The link from a rank's CPU rate per CPU second, as bench_update_phase picks it (in a child:
  // this process starts no threads before its ranks fork).
  const std::string cost = run_ranks(1, false, [&](int, const RankBarrier&) {
    const auto context = open_device(0);
    const CpuCost c = measure_cpu_cost(std::uint64_t{4} << 20, one);
    return std::to_string(c.update) + " " + std::to_string(c.memcpy);
  })[0];
  const double cpu_per_s = std::atof(cost.c_str());
  const double memcpy_per_s = std::atof(cost.c_str() + cost.find(' '));
  const double gbps =
      std::min(25.0 * cpu_per_s * static_cast<double>(share) / 2.2e9, memcpy_per_s / 4 / 1e9);

  MeasureOptions m;
  m.params = std::uint64_t{4} << 20;
  if (s.scalar) m.cpu_isa = kernels::CpuIsa::kScalar;
  m.host_memory_bytes = std::uint64_t{64} << 20;  // 256 MiB in all: past the caches, quickly
  auto measure = [&](const RankBarrier& barrier) {
    const auto context = open_device(gbps);
    barrier();
    return rates_text(measure_rates(m));
  };
  const Rates node =
      slowest(run_ranks(s.ranks, true, [&](int, const RankBarrier& b) { return measure(b); }));
  const Rates alone =
      slowest(run_ranks(1, false, [&](int, const RankBarrier& b) { return measure(b); }));
  std::fprintf(stderr,
               "%s: %d ranks, %zu cores each (node-aware) of %zu; CPU update per rank %.3g "
               "params/s with all running, %.3g alone; simulated links %.2f GB/s; node memory "
               "bandwidth %.2f GB/s\n",
               kName, s.ranks, share, topology.cpu_count(), node.cpu_update, alone.cpu_update, gbps,
               membw);
  for (const RateInfo& info : rate_infos()) {
    std::fprintf(stderr, "  %-36s %s per rank with all running, %s alone\n",
                 std::string(info.description).c_str(),
                 format_rate(info.kind, node.*info.member).c_str(),
                 format_rate(info.kind, alone.*info.member).c_str());
  }

  auto make_case = [](const char* name, bool aware, bool cpu, bool pin, const Rates& r) {
    Case c;
    c.name = name;
    c.node_aware = aware;
    c.all_cpu = cpu;
    c.pin = pin;
    c.rates = r;
    return c;
  };
  std::vector<Case> cases = {make_case("node_aware", true, false, true, node),
                             make_case("unaware", false, false, true, alone),
                             make_case("all_cpu", true, true, true, node),
                             make_case("share_unpinned", true, false, false, node)};
  for (int round = 0; round < s.rounds; ++round) {
    for (Case& c : cases) record(c, run_case(s, c, gbps));
  }
  const double ideal = bench::ideal_seconds(s.params, node.cpu_update_contended, node, 2, 12);
  const double bound = membw * 1e9 / kAdamBytesPerParam;  // params/s the node's memory allows
  const double node_params = s.params * s.ranks;
  for (const Case& c : cases) {
    std::string ranks;
    for (double t : c.rank_seconds) {
      char text[32];
      std::snprintf(text, sizeof text, "%s%.4f", ranks.empty() ? "" : ",", t);
      ranks += text;
    }
    std::printf(
        "{\"bench\":\"node_update\",\"case\":\"%s\",\"ranks\":%d,\"params_per_rank\":%.3g,"
        "\"subgroup_params\":%.3g,\"cpu_threads_per_rank\":%zu,\"rank_seconds\":[%s],"
        "\"phase_seconds\":%.4f,\"predicted_seconds\":%.4f,\"gpu_subgroups\":%zu,"
        "\"node_params_per_s\":%.4g,\"ideal_seconds\":%.4f,\"over_ideal\":%.3f,"
        "\"over_node_aware\":%.3f,\"membw_gbps\":%.2f,\"membw_bound_params_per_s\":%.4g,"
        "\"of_membw_bound\":%.3f,\"copy_gbps\":%.2f,\"cpu_isa\":\"%s\","
        "\"machine\":\"stand-in, %zu cores, simulated copies and GPU per rank\"}\n",
        c.name, s.ranks, s.params, s.subgroup, c.node_aware ? share : topology.cpu_count(),
        ranks.c_str(), c.phase, c.predicted, c.gpu_subgroups, node_params / c.phase, ideal,
        c.phase / ideal, c.phase / cases[0].phase, membw, bound,
        bound > 0 ? node_params / c.phase / bound : 0.0, gbps, s.scalar ? "scalar" : "widest",
        topology.cpu_count());
  }
  for (int ranks : {2, 4, 8}) emit_model(s, s.ranks, node, alone, ranks);
  return 0;
}
