// State past the pinned share (TIDE_NODE_PINNED_LIMIT, set small for this test by CMake) is held
// in pageable memory instead of being refused: the optimizer is made, the subgroups past the
// share are pageable, every policy updates them on the CPU only (never resident), and the result
// is bit for bit that of the same model with all of its state pinned. The stand-in's refused
// registration (tide_standin_fail_pin) does the same at construction.
#include <cstdlib>
#include <cstring>
#include <string>

#include "allocator/memory_resource.h"
#include "allocator/pinned/node_limit.h"
#include "tests/runtime/executor_fixture.h"

namespace tide::runtime::testing {
namespace {

using Faults = allocator::testing::DeviceStandin;

constexpr std::uint64_t kHeadroom = std::uint64_t{1} << 30;
// 4 MiB of buffers per subgroup (a 3 MiB slot, 0.5 MiB each of gradient and weight copy):
// six fill most of the share, so a second model of the same six gets part of it at most.
const std::vector<std::uint64_t> kSizes(6, std::uint64_t{1} << 18);

struct Case {
  Policy policy;
  bool residency = false;
};

void expect_same_state(const Model& pinned, const Model& pageable) {
  for (std::size_t s = 0; s < kSizes.size(); ++s) {
    const OptimizerState& a = *pinned.state;
    const OptimizerState& b = *pageable.state;
    ASSERT_EQ(0, std::memcmp(a.slot(s), b.slot(s), a.slot_bytes(s))) << "state " << s;
    ASSERT_EQ(pinned.device_params(s), pageable.device_params(s)) << "weights " << s;
  }
}

void run_both(const Case& c) {
  const driver::CurrentContext context;
  allocator::DriverResource memory;
  Model pinned(kSizes);
  ASSERT_EQ(pinned.state->pageable_subgroups(), 0u) << "the share must hold the first model";
  Model pageable(kSizes);  // what the first left of the share, then pageable
  const OptimizerState& state = *pageable.state;
  ASSERT_GT(state.pageable_subgroups(), 0u);
  ASSERT_LT(state.pageable_subgroups(), kSizes.size()) << "some of it should still be pinned";
  // The first subgroup that could not be pinned and every one after it.
  const std::size_t first = kSizes.size() - state.pageable_subgroups();
  for (std::size_t s = 0; s < kSizes.size(); ++s) EXPECT_EQ(state.pageable(s), s >= first) << s;
  EXPECT_EQ(state.pageable_bytes(), state.pageable_subgroups() * (12 + 2 + 2) * kSizes[0]);

  Reference ref(*pinned.state);
  ExecutorOptions options = options_for_test();
  options.residency = c.residency;
  options.memory = &memory;
  Executor a(*pinned.state, options);
  Executor b(*pageable.state, options);
  for (int step = 1; step <= 3; ++step) {
    auto grads = pinned.make_gradients(step);
    pageable.make_gradients(step);
    pinned.offload_all(a);
    pageable.offload_all(b);
    a.run(hyper(step), c.policy, kHeadroom);
    const PhaseReport& report = b.run(hyper(step), c.policy, kHeadroom);
    ref.step(grads, hyper(step));
    ASSERT_TRUE(report.fault.empty()) << report.fault;
    for (std::size_t s = first; s < kSizes.size(); ++s) {
      EXPECT_EQ(report.planned.subgroups[s].device, planner::Device::cpu) << s;
      EXPECT_EQ(report.devices[s], planner::Device::cpu) << s;
      EXPECT_FALSE(report.planned.subgroups[s].resident) << s;
      EXPECT_FALSE(b.residency().resident(s)) << s;
    }
    if (c.policy.kind == Policy::Kind::gpu) {
      // Every subgroup that may go to the GPU was planned there, and ran there: the spare slots
      // it needs were kept pinned when the rest became pageable.
      EXPECT_EQ(report.planned.gpu_order.size(), first);
      EXPECT_EQ(report.fallback_subgroups, 0u);
      for (std::size_t s = 0; s < first; ++s) EXPECT_EQ(report.devices[s], planner::Device::gpu);
    }
    a.sync_state(false);
    b.sync_state(false);
    expect_same_state(pinned, pageable);
    expect_matches(pinned, ref);
  }
}

TEST(PageableState, AllCpu) { run_both({Policy::all_cpu()}); }
TEST(PageableState, AllGpu) { run_both({Policy::all_gpu()}); }
TEST(PageableState, InterleavedK2) { run_both({Policy::every(2)}); }
TEST(PageableState, FirstFive) { run_both({Policy::first(5)}); }
TEST(PageableState, Planned) { run_both({Policy::automatic_policy()}); }
TEST(PageableState, PlannedWithResidency) { run_both({Policy::automatic_policy(), true}); }

// The plan keeps the pageable subgroups on the CPU for every policy, before anything runs.
TEST(PageableState, EveryPlanKeepsThemOnTheCpu) {
  const driver::CurrentContext context;
  Model pinned(kSizes);
  Model pageable(kSizes);
  ExecutorOptions options;
  options.rates = test_rates();
  Executor b(*pageable.state, options);
  for (const Policy& p : {Policy::all_gpu(), Policy::every(1), Policy::every(2), Policy::first(6),
                          Policy::automatic_policy()}) {
    const planner::Plan plan = b.plan_for(p, kHeadroom);
    for (std::size_t s = 0; s < kSizes.size(); ++s) {
      if (pageable.state->pageable(s)) {
        EXPECT_EQ(plan.subgroups[s].device, planner::Device::cpu) << policy_name(p) << " " << s;
      }
    }
    EXPECT_FALSE(plan.gpu_order.empty()) << policy_name(p);  // the pinned ones still may
  }
}

// The host refuses to pin (cuMemHostRegister out of memory, as under RLIMIT_MEMLOCK): the state
// is made in pageable memory all the same, and steps with the reference's bits.
TEST(PageableState, RefusedRegistrationAtConstruction) {
  const driver::CurrentContext context;
  Faults faults;
  faults.fail_pin(1);
  Model model({3000, 4096, 777});
  faults.fail_pin(0);
  ASSERT_EQ(model.state->pageable_subgroups(), 3u);
  Reference ref(*model.state);
  Executor executor(*model.state, options_for_test());
  for (int step = 1; step <= 2; ++step) {
    auto grads = model.make_gradients(step);
    model.offload_all(executor);
    const PhaseReport& report = executor.run(hyper(step), Policy::all_gpu(), kHeadroom);
    ref.step(grads, hyper(step));
    EXPECT_TRUE(report.ran.gpu_order.empty());
    expect_matches(model, ref);
  }
}

// Pinning that fails during training (a spare slot a GPU subgroup needs, or the phase's pinned
// counters): the subgroups it concerns are updated on the CPU for that step (fallback), with the
// same bits, and training goes on on the GPU.
TEST(PageableState, PinningThatFailsMidTrainingFallsBackToTheCpu) {
  const driver::CurrentContext context;
  Faults faults;
  Model model({std::uint64_t{1} << 18, std::uint64_t{1} << 18});
  ASSERT_EQ(model.state->pageable_subgroups(), 0u);
  Reference ref(*model.state);
  Executor executor(*model.state, options_for_test());
  for (int step = 1; step <= 2; ++step) {
    auto grads = model.make_gradients(step);
    model.offload_all(executor);
    const std::uint64_t injected = faults.stats().injected_faults;
    if (step == 1) faults.fail_pin(1);  // the first step takes its spares: new pinned memory
    const PhaseReport& report = executor.run(hyper(step), Policy::all_gpu(), kHeadroom);
    faults.fail_pin(0);
    ref.step(grads, hyper(step));
    if (step == 1) {
      EXPECT_EQ(faults.stats().injected_faults, injected + 1);
      EXPECT_GT(report.fallback_subgroups, 0u);
    } else {
      EXPECT_EQ(report.fallback_subgroups, 0u);  // the next step is on the GPU again
    }
    expect_matches(model, ref);
  }
}

}  // namespace
}  // namespace tide::runtime::testing
