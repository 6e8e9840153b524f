#include "planner/refine.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>

#include "planner/planner.h"

namespace tide::planner {
namespace {

std::uint64_t fresh_seed() {
  static std::random_device device;
  return (std::uint64_t{device()} << 32) | device();
}

// Different from the built-in rates by factors of 0.3 to 3.
Rates true_rates(std::mt19937_64& rng) {
  Rates truth = builtin_rates();
  for (const RateInfo& info : rate_infos()) {
    truth.*info.member *= std::exp(std::uniform_real_distribution<double>(-1.2, 1.2)(rng));
  }
  return truth;
}

TEST(Refine, ConvergesFromNoisyMeasurements) {
  // ±10% on each measured time, rates off by up to 3×. Over 20000 simulated seeds the average
  // estimate of the last 100 observations was within 2.4% and the last one within 7.3%.
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Rates truth = true_rates(rng);
  RateRefiner refiner(builtin_rates());
  std::uniform_real_distribution<double> noise(0.9, 1.1);
  std::array<double, kRateCount> log_sum{};
  for (int i = 0; i < 200; ++i) {
    for (const RateInfo& info : rate_infos()) {
      const double amount = 1e8 * (info.scale == 1.0 ? 1 : 12);
      const double seconds = amount / (truth.*info.member) * noise(rng);
      EXPECT_TRUE(refiner.observe(info.kind, amount, seconds));
      if (i >= 100) {
        log_sum[static_cast<std::size_t>(info.kind)] +=
            std::log(refiner.rates().*info.member / (truth.*info.member));
      }
    }
  }
  for (const RateInfo& info : rate_infos()) {
    EXPECT_NEAR(std::exp(log_sum[static_cast<std::size_t>(info.kind)] / 100), 1.0, 0.035)
        << info.key;
    EXPECT_NEAR(refiner.rates().*info.member / (truth.*info.member), 1.0, 0.10) << info.key;
    EXPECT_EQ(refiner.observations(info.kind), 200u);
  }
}

TEST(Refine, ResistsOutliers) {
  // One measurement in twenty is 20× too slow (a preempted thread, a page fault storm). A plain
  // moving average with the same weight is off by ~12% on average and by 4.5× after a few
  // outliers in a row (simulated over 20000 seeds); the clamped one by under 4% and 1.7×.
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Rates truth = true_rates(rng);
  RateRefiner refiner(builtin_rates());
  std::uniform_real_distribution<double> noise(0.95, 1.05);
  std::array<double, kRateCount> log_sum{};
  std::array<double, kRateCount> worst{};
  const int observations = 2000;
  for (int i = 0; i < observations; ++i) {
    for (const RateInfo& info : rate_infos()) {
      double seconds = 1e9 / (truth.*info.member) * noise(rng);
      if (rng() % 20 == 0) seconds *= 20;
      refiner.observe(info.kind, 1e9, seconds);
      if (i < observations / 2) continue;
      const auto k = static_cast<std::size_t>(info.kind);
      const double error = std::log(refiner.rates().*info.member / (truth.*info.member));
      log_sum[k] += error;
      worst[k] = std::max(worst[k], std::fabs(error));
    }
  }
  for (const RateInfo& info : rate_infos()) {
    const auto k = static_cast<std::size_t>(info.kind);
    EXPECT_NEAR(std::exp(log_sum[k] / (observations / 2)), 1.0, 0.06) << info.key;
    EXPECT_LT(std::exp(worst[k]), 2.0) << info.key;
  }
}

TEST(Refine, OneOutlierMovesARateByABoundedFactor) {
  RateRefiner refiner(builtin_rates());
  const double before = refiner.rates().cpu_update;
  // The first observation weighs fully but is clamped to a factor of max_step.
  refiner.observe(RateKind::cpu_update, 1e9, 1e6);
  EXPECT_NEAR(refiner.rates().cpu_update / before, 1 / 1.5, 1e-12);
  // Once warmed up (weight 0.2), one wild value moves it by at most 1.5^0.2 ≈ 8.4%.
  for (int i = 0; i < 20; ++i) refiner.observe(RateKind::cpu_update, before, 1.0);
  const double warm = refiner.rates().cpu_update;
  refiner.observe(RateKind::cpu_update, 1e9, 1e-9);
  EXPECT_LE(refiner.rates().cpu_update / warm, std::pow(1.5, 0.2) + 1e-12);
  refiner.observe(RateKind::cpu_update, 1e9, 1e9);
  EXPECT_GE(refiner.rates().cpu_update / warm, 1.0 / std::pow(1.5, 0.2) * 0.999);
}

TEST(Refine, IgnoresMeasurementsThatAreNotMeasurements) {
  RateRefiner refiner(builtin_rates());
  const double nan = std::nan("");
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(refiner.observe(RateKind::h2d, 1e9, 0));
  EXPECT_FALSE(refiner.observe(RateKind::h2d, 1e9, -1));
  EXPECT_FALSE(refiner.observe(RateKind::h2d, 0, 1));
  EXPECT_FALSE(refiner.observe(RateKind::h2d, nan, 1));
  EXPECT_FALSE(refiner.observe(RateKind::h2d, 1e9, inf));
  EXPECT_FALSE(refiner.observe(RateKind::h2d, 1e300, 1e-300));  // overflows to infinity
  EXPECT_EQ(refiner.rates(), builtin_rates());
  EXPECT_EQ(refiner.observations(RateKind::h2d), 0u);
}

TEST(Refine, RejectsBadOptions) {
  EXPECT_THROW(RateRefiner(builtin_rates(), RefineOptions{0, 1.5}), std::invalid_argument);
  EXPECT_THROW(RateRefiner(builtin_rates(), RefineOptions{1.5, 1.5}), std::invalid_argument);
  EXPECT_THROW(RateRefiner(builtin_rates(), RefineOptions{0.2, 1.0}), std::invalid_argument);
  Rates bad = builtin_rates();
  bad.d2h = -1;
  EXPECT_THROW(RateRefiner{bad}, std::invalid_argument);
}

// An executor's measurements of whole phases, generated from true rates the way the model charges
// them, bring the planner's rates to the truth.
TEST(Refine, WholePhasesBringTheModelToTheMachine) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Rates truth = builtin_rates();
  truth.cpu_update *= 0.7;
  truth.cpu_update_contended *= 0.6;
  truth.h2d_duplex *= 1.3;
  truth.gpu_update *= 2.0;
  Workload w;
  w.subgroup_params.assign(40, 100'000'000);
  w.headroom_bytes = 20'000'000'000;
  const Footprint& f = w.footprint;
  RateRefiner refiner(builtin_rates());
  std::uniform_real_distribution<double> noise(0.97, 1.03);
  for (int iteration = 0; iteration < 30; ++iteration) {
    const Plan p = plan(w, refiner.rates());
    // The same placement under the true rates: its copy-ins share the link with the CPU
    // subgroups' weight uploads as the model charges them.
    const Plan real = evaluate(w, truth, Placement{p.gpu_order, p.buffers});
    std::vector<SubgroupTiming> timings(p.subgroups.size());
    const bool duplex = p.buffers >= 2 && p.gpu_order.size() >= 2;
    for (std::size_t i = 0; i < timings.size(); ++i) {
      const SubgroupPlan& s = p.subgroups[i];
      const double n = static_cast<double>(s.params);
      if (s.device == Device::cpu) {
        const bool contended = !p.gpu_order.empty() && s.end_s <= p.predicted.gpu_side_s;
        timings[i].cpu_update_s =
            n / (contended ? truth.cpu_update_contended : truth.cpu_update) * noise(rng);
      } else {
        const bool last = s.position + 1 == p.gpu_order.size();
        timings[i].h2d_s = (real.subgroups[i].h2d_end_s - real.subgroups[i].start_s) * noise(rng);
        timings[i].gpu_update_s = n / truth.gpu_update * noise(rng);
        timings[i].d2h_s = n * static_cast<double>(f.d2h_bytes_per_param()) /
                           (duplex && !last ? truth.d2h_duplex : truth.d2h) * noise(rng);
      }
    }
    EXPECT_GT(refiner.observe_phase(p, f, timings), 0u);
  }
  for (RateKind kind : {RateKind::cpu_update_contended, RateKind::h2d_duplex, RateKind::d2h_duplex,
                        RateKind::gpu_update}) {
    EXPECT_NEAR(rate_of(refiner.rates(), kind) / rate_of(truth, kind), 1.0, 0.03)
        << rate_info(kind).key;
  }
  EXPECT_THROW(refiner.observe_phase(plan(w, truth), f, std::vector<SubgroupTiming>(3)),
               std::invalid_argument);
}

// The update rates are kept for fp32 state: CPU updates measured with bf16 moments at the model's
// scaled rate (28/20 bytes moved) leave them where they are, instead of scaling them twice.
TEST(Refine, UpdatesWithBf16MomentsAreCreditedAsFp32State) {
  Workload w;
  w.subgroup_params.assign(4, 100'000'000);
  w.headroom_bytes = 0;  // all on the CPU
  w.footprint.state_bytes_per_param = 8;
  const Rates start = builtin_rates();
  RateRefiner refiner(start);
  const Plan p = plan(w, start);
  ASSERT_TRUE(p.gpu_order.empty());
  const double scaled = start.cpu_update * 28.0 / 20.0;
  std::vector<SubgroupTiming> timings(p.subgroups.size());
  for (SubgroupTiming& t : timings) t.cpu_update_s = 1e8 / scaled;
  for (int i = 0; i < 10; ++i) EXPECT_EQ(refiner.observe_phase(p, w.footprint, timings), 4u);
  EXPECT_NEAR(refiner.rates().cpu_update / start.cpu_update, 1.0, 1e-9);
}

// 8-bit moments: the CPU update is compute-bound, the model's CPU rate is fp32 state's times
// Footprint::kQ8CpuUpdateFactor (not the bytes' 28/16). Updates measured at that rate leave the
// fp32-state rate where it is; ones twice as fast double it (the refiner learns the real rate).
TEST(Refine, UpdatesWithQ8MomentsAreCreditedAtTheirCpuFactor) {
  Workload w;
  w.subgroup_params.assign(4, 100'000'000);
  w.headroom_bytes = 0;  // all on the CPU
  w.footprint.state_bytes_per_param = 6;
  w.footprint.quantized_moments = true;
  const Rates start = builtin_rates();
  const Plan p = plan(w, start);
  ASSERT_TRUE(p.gpu_order.empty());
  const double scaled = start.cpu_update * Footprint::kQ8CpuUpdateFactor;
  EXPECT_NEAR(p.predicted.all_cpu_s, 4e8 / scaled, 1e-9 * p.predicted.all_cpu_s);
  for (double speed : {1.0, 2.0}) {
    RateRefiner refiner(start);
    std::vector<SubgroupTiming> timings(p.subgroups.size());
    for (SubgroupTiming& t : timings) t.cpu_update_s = 1e8 / (speed * scaled);
    for (int i = 0; i < 40; ++i) EXPECT_EQ(refiner.observe_phase(p, w.footprint, timings), 4u);
    EXPECT_NEAR(refiner.rates().cpu_update / start.cpu_update, speed, 0.02 * speed) << speed;
  }
}

}  // namespace
}  // namespace tide::planner
