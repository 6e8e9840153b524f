// Plans around resident subgroups (planner/resident_plan.h), with constructed rates: where the
// resident updates go, what they cost when a state joins, what they leave the other subgroups,
// and when residency is preferred.
#include "planner/resident_plan.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "planner/cpu_only.h"

namespace tide::planner {
namespace {

constexpr std::uint64_t kParams = 100'000'000;  // per subgroup
constexpr std::uint64_t kSlot = 12 * kParams;   // fp32 master weights and moments

// A CPU at 1e9 params/s, a 10 GB/s link each way, a GPU update at 1e11 params/s; host memory
// that never binds.
Rates rates() {
  Rates r;
  r.cpu_update = r.cpu_update_contended = 1e9;
  r.h2d = r.d2h = r.h2d_duplex = r.d2h_duplex = 10e9;
  r.gpu_update = 1e11;
  r.host_memory = r.host_memory_contended = 1e13;
  return r;
}

Workload workload(std::size_t subgroups, std::uint64_t headroom) {
  Workload w;
  w.subgroup_params.assign(subgroups, kParams);
  w.headroom_bytes = headroom;
  w.footprint.stage_low_precision_weights();
  return w;
}

ResidentLayout layout(std::size_t subgroups) {
  ResidentLayout l;
  l.slot_bytes.assign(subgroups, kSlot);
  l.lane_bytes = kSlot + kParams * 4;  // a slot, the gradient and the bf16 weights
  return l;
}

TEST(ResidentPlan, ResidentUpdatesRunFirstOnTheGpuSideWithTheirCopiesIn) {
  const Workload w = workload(4, 0);
  Workload rest_w = w;
  rest_w.subgroup_params.assign(2, kParams);
  const Plan rest = all_cpu_plan(rest_w, rates());
  // Subgroup 1 joins and its gradient was not kept on the GPU; subgroup 3 needs neither copy.
  const Plan p = residents_first(w, rates(), layout(4).slot_bytes, &rest, {0, 2},
                                 {{1, true, true}, {3, false, false}});
  EXPECT_EQ(p.gpu_order, (std::vector<std::size_t>{1, 3}));
  EXPECT_EQ(p.cpu_order, (std::vector<std::size_t>{0, 2}));
  const SubgroupPlan &joining = p.subgroups[1], &staying = p.subgroups[3];
  EXPECT_TRUE(joining.resident && staying.resident);
  EXPECT_EQ(joining.device, Device::gpu);
  // 1.2 GB of state and 0.2 GB of gradient at 10 GB/s, then 1e8 params at 1e11 params/s.
  EXPECT_DOUBLE_EQ(joining.start_s, 0.0);
  EXPECT_DOUBLE_EQ(joining.h2d_end_s, 0.14);
  EXPECT_DOUBLE_EQ(joining.end_s, 0.141);
  EXPECT_DOUBLE_EQ(staying.start_s, 0.141);
  EXPECT_DOUBLE_EQ(staying.h2d_end_s, 0.141);
  EXPECT_DOUBLE_EQ(staying.end_s, 0.142);
  EXPECT_EQ(joining.position, 0U);
  EXPECT_EQ(staying.position, 1U);
  // The CPU subgroups keep their times from the plan of the rest: 0.1 s each, one after another.
  EXPECT_DOUBLE_EQ(p.subgroups[0].end_s, rest.subgroups[0].end_s);
  EXPECT_DOUBLE_EQ(p.subgroups[2].end_s, rest.subgroups[1].end_s);
  EXPECT_DOUBLE_EQ(p.predicted.gpu_side_s, 0.142);
  EXPECT_DOUBLE_EQ(p.predicted.phase_s, rest.predicted.phase_s);
  EXPECT_DOUBLE_EQ(p.predicted.all_cpu_s, 0.4);
  EXPECT_EQ(p.gpu_params, 2 * kParams);
}

TEST(ResidentPlan, AJoinIsPaidInThisPhaseButNotInTheSteadyOne) {
  const Workload w = workload(4, 100 * kSlot);
  const ResidentPlan r = plan_around_resident(
      w, rates(), layout(4),
      {{0, true, false}, {1, true, false}, {2, true, false}, {3, true, false}}, {});
  // Each joins with 1.2 GB at 10 GB/s before its kernel (1 ms); steady, only the kernels.
  EXPECT_NEAR(r.plan.predicted.phase_s, 4 * 0.121, 1e-12);
  EXPECT_NEAR(r.steady_phase_s, 4 * 0.001, 1e-12);
  EXPECT_EQ(r.plan.resident_state_bytes, 4 * kSlot);
  EXPECT_EQ(r.plan.resident_bytes, 4 * kParams * 2);  // their gradients, kept on the GPU
  EXPECT_EQ(r.plan.buffer_bytes, layout(4).lane_bytes);
  EXPECT_TRUE(r.plan.cpu_order.empty());
}

TEST(ResidentPlan, AJoinIsChargedToTheLinkAndToHostMemory) {
  Rates slow_host = rates();
  slow_host.host_memory = slow_host.host_memory_contended = 5e9;
  const ResidentPlan r = plan_around_resident(
      workload(4, 100 * kSlot), slow_host, layout(4),
      {{0, true, true}, {1, true, false}, {2, false, false}, {3, false, false}}, {});
  // 2.4 GB of state and 0.2 GB of gradient: 0.26 s on the link, 0.52 s through host memory.
  EXPECT_NEAR(r.plan.predicted.link_s, 0.26, 1e-12);
  EXPECT_NEAR(r.plan.predicted.host_s, 0.52, 1e-12);
  EXPECT_NEAR(r.plan.predicted.phase_s, 0.52, 1e-12);
  // Steady, subgroup 0's gradient still comes in (not kept on the GPU): 0.04 s of host memory.
  EXPECT_NEAR(r.steady_phase_s, 0.04, 1e-12);
}

TEST(ResidentPlan, TheOtherSubgroupsArePlannedInWhatTheResidentOnesLeave) {
  const ResidentLayout l = layout(6);
  // Held by one resident subgroup: its slot, its kept gradient and a lane.
  const std::uint64_t reserved = kSlot + kParams * 2 + l.lane_bytes;
  const ResidentPlan tight =
      plan_around_resident(workload(6, reserved + 1), rates(), l, {{0, false, false}}, {});
  EXPECT_EQ(tight.plan.gpu_order, (std::vector<std::size_t>{0}));
  EXPECT_EQ(tight.plan.cpu_order.size(), 5U);
  // The same headroom without the resident subgroup has room for copied-in ones.
  const Plan without = plan_allowed(workload(6, reserved + 1), rates(), {});
  EXPECT_GT(without.gpu_subgroups(), 0U);
  // With room for lanes beside it, the rest is copied in as without residency.
  const ResidentPlan roomy = plan_around_resident(workload(6, reserved + 10 * l.lane_bytes),
                                                  rates(), l, {{0, false, false}}, {});
  EXPECT_GT(roomy.plan.gpu_subgroups(), 1U);
  EXPECT_EQ(roomy.plan.gpu_order.front(), 0U);
}

TEST(ResidentPlan, ResidencyIsPreferredOnlyWhereItsSteadyPhaseIsNoSlower) {
  const ResidentLayout l = layout(10);
  // Room for every state: no copies at all beat any copied-in plan.
  const Workload roomy = workload(10, 100 * kSlot);
  std::vector<ResidentUpdate> all;
  for (std::size_t s = 0; s < 10; ++s) all.push_back({s, true, false});
  const ResidentPlan everything = plan_around_resident(roomy, rates(), l, all, {});
  EXPECT_TRUE(prefer_resident(everything, plan_allowed(roomy, rates(), {}), false, 0.05));
  // Room for two lanes: one resident subgroup takes it, and the other nine go to the CPU
  // (0.9 s), where two lanes copy some in beside the CPU's.
  const Workload two_lanes = workload(10, 2 * l.lane_bytes);
  const ResidentPlan one = plan_around_resident(two_lanes, rates(), l, {{0, true, false}}, {});
  const Plan without = plan_allowed(two_lanes, rates(), {});
  EXPECT_NEAR(one.steady_phase_s, 0.9, 1e-9);
  EXPECT_LT(without.predicted.phase_s, 0.9);
  EXPECT_FALSE(prefer_resident(one, without, false, 0.05));
}

TEST(ResidentPlan, ResidencyStaysUntilThePlanWithoutItIsFasterByMoreThanTheBand) {
  Plan without;
  without.predicted.phase_s = 1.0;
  ResidentPlan with;
  with.steady_phase_s = 1.04;  // 4% slower than without: inside a 5% band
  EXPECT_FALSE(prefer_resident(with, without, false, 0.05));  // nothing resident: not joined
  EXPECT_TRUE(prefer_resident(with, without, true, 0.05));    // resident: stays
  with.steady_phase_s = 1.06;                                 // past the band: leaves
  EXPECT_FALSE(prefer_resident(with, without, true, 0.05));
  EXPECT_FALSE(prefer_resident(with, without, true, 0.0));
  with.steady_phase_s = 1.0;  // a tie joins and stays
  EXPECT_TRUE(prefer_resident(with, without, false, 0.0));
  EXPECT_TRUE(prefer_resident(with, without, true, 0.0));
}

TEST(ResidentPlan, SubgroupsThatMayNotGoToTheGpuStayOnTheCpu) {
  // A link 10x faster than the CPU: every subgroup allowed goes to the GPU.
  Rates fast_link = rates();
  fast_link.h2d = fast_link.d2h = fast_link.h2d_duplex = fast_link.d2h_duplex = 1e12;
  ResidentLayout l = layout(4);
  const ResidentPlan all =
      plan_around_resident(workload(4, 100 * kSlot), fast_link, l, {{0, false, false}}, {});
  EXPECT_TRUE(all.plan.cpu_order.empty());
  l.gpu_allowed = {1, 1, 0, 0};
  const ResidentPlan r =
      plan_around_resident(workload(4, 100 * kSlot), fast_link, l, {{0, false, false}}, {});
  EXPECT_EQ(r.plan.gpu_order, (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(r.plan.cpu_order, (std::vector<std::size_t>{2, 3}));
}

TEST(ResidentPlan, ALayoutThatDoesNotMatchIsRefused) {
  const Workload w = workload(4, 100 * kSlot);
  EXPECT_THROW(plan_around_resident(w, rates(), layout(3), {{0, false, false}}, {}),
               std::invalid_argument);
  ResidentLayout flags = layout(4);
  flags.gpu_allowed = {1, 1};
  EXPECT_THROW(plan_around_resident(w, rates(), flags, {{0, false, false}}, {}),
               std::invalid_argument);
  EXPECT_THROW(plan_around_resident(w, rates(), layout(4), {{4, false, false}}, {}),
               std::invalid_argument);
  EXPECT_THROW(
      plan_around_resident(w, rates(), layout(4), {{1, false, false}, {1, true, false}}, {}),
      std::invalid_argument);
}

}  // namespace
}  // namespace tide::planner
