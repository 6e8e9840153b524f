// Overlap, measured, on the stand-in driver with simulated copy bandwidth and a simulated GPU
// kernel (a sleep: a GPU takes no host CPU):
//   1. the update phase of tide's plan takes at most 1.15x the ideal max(CPU side, copy side) of
//      that plan, from rates measured in this test; the test insists that both sides are at least
//      0.4 of the ideal, so copies and CPU updates run one after the other take 1.4x or more and
//      fail it (they measured about 1.8x when the executor was made to wait for its GPU side);
//   2. the planner's choice is within 5% of the best of a sweep of fixed K (and all-CPU).
//
// Built to give stable ratios on a 2-core machine that is busy with other work (a parallel
// build, other tests):
// - The copies are sleeps. The stand-in does a real memcpy behind each simulated copy and then
//   sleeps until the simulated link would have finished; the simulated bandwidth is at most a
//   quarter of the memcpy rate, so the copy threads mostly sleep, ask little of the cores, and
//   their times hold however busy the machine is.
// - The CPU update runs on one thread with the scalar kernel. This machine's vector kernels update
//   about 9e8 params/s on one thread, which no such link can keep up with (the memcpy behind it
//   moves about 6-7 GB/s); the scalar kernel, about 1e8 params/s, lets the simulated link keep the
//   H100 node's ratio (25 GB/s against a CPU update of 2.2e9 params/s per rank, as in
//   bench/update_phase.cpp) at about a sixth of the memcpy rate.
// - The link is set from CPU-time rates (the update's and memcpy's per second of thread CPU
//   time), so that a busy machine picks the same link as an idle one.
// - Few, large subgroups (24 of 3.5e6 parameters, about 1.7 GB of state and gradients in all):
//   phases of about 0.6 s, against which thread wake-ups and scheduling jitter (milliseconds) are
//   small, and a test of about half a minute (a minute under a parallel build). Not fewer: the
//   pipeline's drain (the last GPU subgroup's copy-out, after the link has carried everything
//   else) is one subgroup's copy time that no overlap can hide, about 6% of the phase here.
// - The CPU side of the ideal is what the CPU workers took in the very phase being judged
//   (PhaseReport::cpu_seconds): on a busy 2-core machine the one CPU thread's share of a core
//   changes from one second to the next, so a CPU rate measured at any other moment can be 30%
//   off, which no 15% bound survives. The copy side comes from the copy rates measured at the
//   start, which the simulation keeps. The CPU rates measured at the start plan the first phases
//   (the executor refines them as it runs, as in training) and are printed next to the in-phase
//   rate.
// - Every measured configuration is run three times and the best kept (the standard practice for
//   timing under noise: noise on a shared machine only ever slows a run down); the sweep runs in
//   rounds over every policy, so that a change of the machine's load hits them all.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "executor_fixture.h"
#include "scheduler/measure.h"

namespace tide::scheduler::testing {
namespace {

constexpr std::uint64_t kHeadroom = std::uint64_t{4} << 30;
constexpr std::size_t kSubgroups = 24;
constexpr std::uint64_t kParams = 3'500'000;
constexpr int kRepeats = 3;
constexpr kernels::CpuIsa kIsa = kernels::CpuIsa::kScalar;

struct TimingSetup {
  std::unique_ptr<driver::PrimaryContext> context;
  std::unique_ptr<allocator::testing::DeviceStandin> standin;
  std::unique_ptr<Model> model;
  std::unique_ptr<Executor> executor;
  Rates measured;
  double gbps = 0;  // the simulated link, each way
};

TimingSetup& setup() {
  static TimingSetup* s = [] {
    auto* out = new TimingSetup;
    out->context = std::make_unique<driver::PrimaryContext>();
    out->standin = std::make_unique<allocator::testing::DeviceStandin>();
    use_sleeping_gpu(2e10);
    // The simulated link: the H100 node's ratio to the CPU update, at most a quarter of the
    // memcpy rate, both from CPU time so that a busy machine picks the same link as an idle one.
    const CpuCost cost = measure_cpu_cost(std::uint64_t{4} << 20,
                                          {.threads = 1, .force_isa = true, .isa = kIsa}, kRepeats);
    out->gbps = std::min(25e9 * cost.update / 2.2e9, cost.memcpy / 4) / 1e9;
    out->standin->set_bandwidth(out->gbps, out->gbps);
    // Every rate with the simulated link, in wall-clock time: these plan the phases (and the
    // measured phases refine them as they run).
    MeasureOptions m;
    m.params = std::uint64_t{4} << 20;
    m.cpu_threads = 1;
    m.cpu_isa = kIsa;
    out->measured = measure_rates(m);
    const Rates& r = out->measured;
    std::printf(
        "per CPU second: update %.3g params/s, memcpy %.2f GB/s; simulated copies %.2f GB/s; "
        "measured: cpu %.3g, contended %.3g params/s, h2d %.2f d2h %.2f duplex %.2f/%.2f GB/s, "
        "gpu %.3g params/s\n",
        cost.update, cost.memcpy / 1e9, out->gbps, r.cpu_update, r.cpu_update_contended,
        r.h2d / 1e9, r.d2h / 1e9, r.h2d_duplex / 1e9, r.d2h_duplex / 1e9, r.gpu_update);
    out->model = std::make_unique<Model>(std::vector<std::uint64_t>(kSubgroups, kParams), 0, 3,
                                         /*init=*/false);
    ExecutorOptions options;
    options.rates = out->measured;
    options.cpu_threads = 1;
    options.cpu_isa = kIsa;
    out->executor = std::make_unique<Executor>(*out->model->state, options);
    return out;
  }();
  return *s;
}

// One phase, with what the ideal of its placement needs.
struct Phase {
  double seconds = 1e300;
  double cpu_seconds = 0;  // the CPU workers' busy time in this phase
  Plan ran;
};

Phase run_once(const Policy& policy) {
  const PhaseReport& r = setup().executor->run(hyper(1), policy, kHeadroom);
  return Phase{r.seconds, r.cpu_seconds, r.ran};
}

// The ideal of a placement: its CPU side and its copy side (the host-to-GPU link carries the GPU
// subgroups' state and gradients in and the CPU subgroups' bf16 weights up, the GPU-to-host link
// the GPU subgroups' state out), perfectly overlapped.
struct Sides {
  double cpu = 0, copy = 0;
  double ideal() const { return std::max(cpu, copy); }
  double serial() const { return cpu + copy; }
};
Sides sides_of(const Phase& phase, const Rates& r) {
  const auto g = static_cast<double>(phase.ran.gpu_params);
  const auto c = static_cast<double>(phase.ran.cpu_params);
  Sides s;
  s.cpu = phase.cpu_seconds;
  const double in = g * 14 + c * 2, out = g * 12;
  s.copy = g > 0 ? std::max(in / r.h2d_duplex, out / r.d2h_duplex) : in / r.h2d;
  return s;
}

TEST(ExecutorOverlap, PlannedPhaseIsWithin15PercentOfTheIdealOverlap) {
  TimingSetup& s = setup();
  const Rates& r = s.measured;
  run_once(Policy::automatic_policy());  // warm: buffers, pages
  double best = 1e300;
  Phase chosen;
  for (int i = 0; i < kRepeats; ++i) {
    const Phase p = run_once(Policy::automatic_policy());
    const Sides sd = sides_of(p, r);
    std::printf(
        "tide's plan: %zu of %zu subgroups on the GPU, %zu buffers: measured %.3f s, ideal %.3f s "
        "(CPU side %.3f s: %.3g params/s, %.3g measured before; copy side %.3f s), one after the "
        "other %.3f s: %.3fx the ideal\n",
        p.ran.gpu_order.size(), kSubgroups, p.ran.buffers, p.seconds, sd.ideal(), sd.cpu,
        static_cast<double>(p.ran.cpu_params) / sd.cpu, r.cpu_update_contended, sd.copy,
        sd.serial(), p.seconds / sd.ideal());
    if (p.seconds / sd.ideal() < best) {
      best = p.seconds / sd.ideal();
      chosen = p;
    }
  }
  const Sides sd = sides_of(chosen, r);
  std::printf("best of %d: %.3fx the ideal (one after the other: %.3fx)\n", kRepeats, best,
              sd.serial() / sd.ideal());
  // Both sides substantial, so that running them one after the other would take at least 1.4x
  // the ideal and fail the bound.
  ASSERT_GE(std::min(sd.cpu, sd.copy), 0.4 * sd.ideal());
  EXPECT_LE(best, 1.15);
}

TEST(ExecutorOverlap, PlannerIsWithin5PercentOfTheBestFixedK) {
  setup();
  run_once(Policy::automatic_policy());
  // Rounds over every policy, each keeping its best: drift of the machine's load hits them all.
  std::map<std::string, double> best;
  std::map<std::string, std::size_t> gpu_subgroups;
  // K = 2, 3, 4, 5, 6, 8: every count of GPU subgroups an interleaving of 24 gives from 12 down
  // to 3 (K = 7 repeats the count of 6, equal subgroups making them the same phase).
  std::vector<Policy> policies = {Policy::automatic_policy(), Policy::all_cpu()};
  for (std::size_t k : {2, 3, 4, 5, 6, 8}) policies.push_back(Policy::every(k));
  for (int round = 0; round < kRepeats; ++round) {
    // Each round starts one policy further on, so that none always follows the same one.
    std::rotate(policies.begin(), policies.begin() + 1, policies.end());
    for (const Policy& p : policies) {
      const Phase phase = run_once(p);
      auto [it, fresh] = best.emplace(policy_name(p), phase.seconds);
      if (!fresh) it->second = std::min(it->second, phase.seconds);
      gpu_subgroups[policy_name(p)] = phase.ran.gpu_order.size();
    }
  }
  double fixed = 1e300;
  std::string fixed_name;
  for (const auto& [name, t] : best) {
    std::printf("%s (%zu on the GPU) %.3f s  ", name.c_str(), gpu_subgroups[name], t);
    if (name != "auto" && t < fixed) {
      fixed = t;
      fixed_name = name;
    }
  }
  std::printf("\nauto %.3f s against the best fixed policy (%s) %.3f s: %.3fx\n", best["auto"],
              fixed_name.c_str(), fixed, best["auto"] / fixed);
  // The best fixed K, or all-CPU (K = infinity) when no K pays off on this machine.
  EXPECT_LE(best["auto"], 1.05 * fixed);
}

}  // namespace
}  // namespace tide::scheduler::testing
