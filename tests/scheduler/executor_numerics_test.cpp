// The same updates whichever side runs a subgroup: all-CPU, all-GPU, interleaved and planned
// placements give the reference's bits (the stand-in's GPU kernel is the host twin of the real
// kernel, and both compute kernels/adam_math.h exactly), over several steps, with subgroups of
// odd sizes and subgroups split over several parameter tensors.
#include <limits>

#include "executor_fixture.h"
#include "scheduler/gradient_stats.h"

namespace tide::scheduler::testing {
namespace {

constexpr std::uint64_t kHeadroom = std::uint64_t{1} << 30;

void run_steps(const Policy& policy, bool gradients_on_gpu, bool prepare) {
  driver::PrimaryContext context;
  Model model({3000, 4096, 777, 10000, 1, 2048, 5000}, /*split_every=*/2);
  Reference ref(*model.state);
  ExecutorOptions options;
  options.rates = test_rates();
  options.gradients_on_gpu = gradients_on_gpu;
  options.refine = false;  // the stand-in's measured times must not change the placement here
  Executor executor(*model.state, options);
  for (int step = 1; step <= 3; ++step) {
    auto grads = model.make_gradients(step);
    if (prepare) executor.prepare(policy, kHeadroom);
    model.offload_all(executor);
    const PhaseReport& report = executor.run(hyper(step), policy, kHeadroom);
    const std::uint64_t ref_nonfinite = ref.step(grads, hyper(step));
    EXPECT_EQ(report.nonfinite, ref_nonfinite);
    EXPECT_EQ(report.fallback_subgroups, 0u);
    expect_matches(model, ref);
    if (policy.kind == Policy::Kind::cpu) {
      EXPECT_TRUE(report.ran.gpu_order.empty());
    }
    if (policy.kind == Policy::Kind::gpu) {
      EXPECT_TRUE(report.ran.cpu_order.empty());
    }
    if (policy.kind != Policy::Kind::cpu) {
      EXPECT_FALSE(report.ran.gpu_order.empty());
    }
    if (policy.kind == Policy::Kind::automatic) {
      EXPECT_FALSE(report.ran.cpu_order.empty());
    }
    if (policy.kind == Policy::Kind::first) {
      EXPECT_EQ(report.ran.gpu_order, (std::vector<std::size_t>{0, 1, 2}));
    }
  }
}

TEST(ExecutorNumerics, AllCpu) { run_steps(Policy::all_cpu(), false, false); }
TEST(ExecutorNumerics, AllGpu) { run_steps(Policy::all_gpu(), false, false); }
TEST(ExecutorNumerics, InterleavedK2) { run_steps(Policy::every(2), false, false); }
TEST(ExecutorNumerics, InterleavedK3) { run_steps(Policy::every(3), false, false); }
TEST(ExecutorNumerics, FirstThree) { run_steps(Policy::first(3), false, false); }
TEST(ExecutorNumerics, Planned) { run_steps(Policy::automatic_policy(), false, false); }
TEST(ExecutorNumerics, PlannedWithGradientsKeptOnGpu) {
  run_steps(Policy::automatic_policy(), true, true);
}
TEST(ExecutorNumerics, AllGpuWithGradientsKeptOnGpu) { run_steps(Policy::all_gpu(), true, true); }

TEST(ExecutorNumerics, PlannerUsesTheGpuWithTheseRates) {
  driver::PrimaryContext context;
  Model model(std::vector<std::uint64_t>(8, 4096));
  ExecutorOptions options;
  options.rates = test_rates();
  Executor executor(*model.state, options);
  const Plan plan = executor.plan_for(Policy::automatic_policy(), kHeadroom);
  EXPECT_GT(plan.gpu_order.size(), 0u);
  EXPECT_GT(plan.cpu_order.size(), 0u);
  EXPECT_TRUE(executor.plan_for(Policy::automatic_policy(), 0).gpu_order.empty());
}

// Non-finite gradients: counted per phase, never written, the same on both sides.
TEST(ExecutorNumerics, NonFiniteGradientsAreReportedAndNeverWritten) {
  for (const Policy& policy : {Policy::all_cpu(), Policy::all_gpu()}) {
    driver::PrimaryContext context;
    Model model({1000, 1000});
    Reference ref(*model.state);
    ExecutorOptions options;
    options.rates = test_rates();
    Executor executor(*model.state, options);
    auto grads = model.make_gradients(1);
    grads[0][10] = 0x7fc0;  // NaN
    grads[1][20] = 0x7f80;  // +inf
    for (std::size_t i = 0; i < 2; ++i)
      driver::copy_to_device(model.grads[i].get(), grads[i].data(), 2000);
    const float before0 = model.state->param(0)[10];
    model.offload_all(executor);
    const GradientStats stats = gradient_stats(*model.state, executor.offload());
    EXPECT_EQ(stats.nonfinite, 2u);
    EXPECT_GT(stats.sum_squares, 0.0);
    const PhaseReport& report = executor.run(hyper(1), policy, kHeadroom);
    EXPECT_EQ(report.nonfinite, 2u) << policy_name(policy);
    EXPECT_EQ(ref.step(grads, hyper(1)), 2u);
    EXPECT_EQ(model.state->param(0)[10], before0);
    expect_matches(model, ref);
  }
}

TEST(ExecutorNumerics, GradientStatsMatchTheGradients) {
  driver::PrimaryContext context;
  Model model({5000, 123});
  ExecutorOptions options;
  options.rates = test_rates();
  Executor executor(*model.state, options);
  auto grads = model.make_gradients(4);
  model.offload_all(executor);
  double expected = 0;
  for (const auto& g : grads) {
    for (std::uint16_t x : g)
      expected += double(kernels::bf16_to_float(x)) * kernels::bf16_to_float(x);
  }
  const GradientStats stats = gradient_stats(*model.state, executor.offload());
  EXPECT_EQ(stats.nonfinite, 0u);
  EXPECT_NEAR(stats.sum_squares, expected, expected * 1e-12);
}

}  // namespace
}  // namespace tide::scheduler::testing
