// Plans in which some subgroups may not go to the GPU (planner/cpu_only.h): they stay on the CPU
// in the automatic plan and in any fixed policy's, and the plan's prediction charges their CPU
// time.
#include "planner/cpu_only.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "planner/interleave.h"

namespace tide::planner {
namespace {

Rates rates() {
  Rates r;
  r.cpu_update = 1e8;
  r.cpu_update_contended = 9e7;
  r.h2d = r.d2h = 2e9;
  r.h2d_duplex = r.d2h_duplex = 1.8e9;
  r.gpu_update = 1e10;
  return r;
}

Workload workload() {
  Workload w;
  w.subgroup_params = std::vector<std::uint64_t>(8, 10'000'000);
  w.headroom_bytes = std::uint64_t{4} << 30;
  return w;
}

const std::vector<char> kAllowed = {1, 1, 1, 1, 1, 0, 0, 0};

void expect_on_cpu(const Plan& p) {
  for (std::size_t s = 5; s < 8; ++s) {
    EXPECT_EQ(p.subgroups[s].device, Device::cpu) << s;
    EXPECT_EQ(std::count(p.gpu_order.begin(), p.gpu_order.end(), s), 0) << s;
  }
  EXPECT_GE(p.cpu_params, 3 * std::uint64_t{10'000'000});
}

TEST(CpuOnly, TheAutomaticPlanKeepsThemOnTheCpuAndChargesThem) {
  const Plan free = plan(workload(), rates());
  const Plan p = plan_allowed(workload(), rates(), kAllowed);
  expect_on_cpu(p);
  EXPECT_FALSE(p.gpu_order.empty());
  // Three subgroups forced onto the CPU cost time the free plan did not spend.
  EXPECT_GE(p.predicted.phase_s, free.predicted.phase_s);
  EXPECT_GE(p.predicted.cpu_side_s, 3 * 10'000'000 / rates().cpu_update * 0.99);
  // Never predicted slower than all-CPU.
  EXPECT_LE(p.predicted.phase_s, all_cpu_plan(workload(), rates()).predicted.phase_s);
}

TEST(CpuOnly, FixedPoliciesLoseThemToTheCpu) {
  std::vector<std::size_t> all(8);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  const Plan gpu = *plan_for_order(workload(), rates(), all);
  const Plan p = without_disallowed(gpu, workload(), rates(), kAllowed);
  expect_on_cpu(p);
  EXPECT_EQ(p.gpu_order, (std::vector<std::size_t>{0, 1, 2, 3, 4}));
  const Plan k2 = *plan_interleaved(workload(), rates(), 2);
  expect_on_cpu(without_disallowed(k2, workload(), rates(), kAllowed));
}

TEST(CpuOnly, NoneDisallowedIsThePlannersOwnPlan) {
  const Plan free = plan(workload(), rates());
  EXPECT_EQ(plan_allowed(workload(), rates(), {}).gpu_order, free.gpu_order);
  EXPECT_EQ(plan_allowed(workload(), rates(), std::vector<char>(8, 1)).gpu_order, free.gpu_order);
  EXPECT_EQ(without_disallowed(free, workload(), rates(), {}).gpu_order, free.gpu_order);
  const Plan none = plan_allowed(workload(), rates(), std::vector<char>(8, 0));
  EXPECT_TRUE(none.gpu_order.empty());
  EXPECT_THROW(plan_allowed(workload(), rates(), {1, 0}), std::invalid_argument);
}

}  // namespace
}  // namespace tide::planner
