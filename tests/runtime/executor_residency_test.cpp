// Resident subgroups (runtime/residency.h): placement "auto" keeps the state of the subgroups
// the held memory allows on the device across phases. Their updates copy no state over the link
// and give the reference's bits; the pinned slots are a mirror made current by sync_state; the
// set follows the memory (joins; leaves, its state sent home while the CPU works; stays within
// the hysteresis band); and faults keep the step contract: a failed copy or allocation is
// completed on the CPU from the device's state, a lost device loses only what was never
// mirrored, and says so.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <string>

#include "allocator/memory_resource.h"
#include "tests/runtime/executor_fixture.h"

namespace tide::runtime::testing {
namespace {

using Faults = allocator::testing::DeviceStandin;

constexpr std::uint64_t kHeadroom = std::uint64_t{1} << 30;
const std::vector<std::uint64_t> kSizes = {3000, 4096, 777, 10000, 2048};

struct ResidencyTest : ::testing::Test {
  Faults faults;
  allocator::DriverResource memory;
  void TearDown() override {
    faults.fail_copy(0);
    faults.fail_alloc(0);
    faults.fail_launch(0);
    faults.device_lost(0);
  }

  // One automatic step with kHeadroom, the reference's too: it ran without a fault and left
  // every subgroup resident. `stats`: the stand-in's counts of the step's copies and launches.
  void all_resident_step(Model& model, Executor& executor, Reference& ref, int step,
                         tide_standin_stats* stats) {
    auto grads = model.make_gradients(step);
    model.offload_all(executor);
    faults.reset_stats();
    const PhaseReport& report = executor.run(hyper(step), Policy::automatic_policy(), kHeadroom);
    *stats = faults.stats();
    ref.step(grads, hyper(step));
    ASSERT_TRUE(report.fault.empty()) << report.fault;
    ASSERT_EQ(report.resident_subgroups, model.state->size());
  }

  // One automatic step with `headroom`, the reference's too: it ran without a fault, and the
  // pinned slots are made current for the caller to compare.
  const PhaseReport& synced_step(Model& model, Executor& executor, Reference& ref, int step,
                                 std::uint64_t headroom) {
    auto grads = model.make_gradients(step);
    model.offload_all(executor);
    const PhaseReport& report = executor.run(hyper(step), Policy::automatic_policy(), headroom);
    ref.step(grads, hyper(step));
    EXPECT_TRUE(report.fault.empty()) << report.fault;
    executor.sync_state(false);
    return report;
  }

  // Step 1 with `headroom` (`resident` subgroups join), then step 2 run once with nothing
  // failing and once with each of its copies, then each of its kernel launches, failing in
  // turn, each time from a fresh model: step 2 completes exactly (nothing left not updated or
  // unwritten), and so does step 3, the model's weights included.
  void every_copy_or_launch_failing_in_turn(const std::vector<std::uint64_t>& sizes,
                                            std::size_t split_every, const ExecutorOptions& options,
                                            std::uint64_t headroom, std::size_t resident) {
    const Policy policy = Policy::automatic_policy();
    enum class Fail { nothing, copy, launch };
    // Returns the copies and launches of the step.
    auto step_failing = [&](Fail what, std::uint64_t n) {
      const std::string at = (what == Fail::copy ? "copy " : "launch ") + std::to_string(n);
      const driver::CurrentContext context;
      Model model(sizes, split_every);
      Reference ref(*model.state);
      Executor executor(*model.state, options);
      auto grads = step_with_room_then_offload(model, executor, ref, headroom);
      EXPECT_EQ(executor.last_report().resident_subgroups, resident);
      executor.ready(hyper(2));
      faults.reset_stats();
      if (what == Fail::copy) faults.fail_copy(n);
      if (what == Fail::launch) faults.fail_launch(n);
      const PhaseReport report = executor.run(hyper(2), policy, headroom);
      const tide_standin_stats stats = faults.stats();
      faults.fail_copy(0);
      faults.fail_launch(0);
      ref.step(grads, hyper(2));
      if (stats.injected_faults > 0) {
        EXPECT_FALSE(report.fault.empty()) << at;
      } else {
        EXPECT_TRUE(report.fault.empty()) << at << ": " << report.fault;
      }
      if (what == Fail::nothing) {  // the plan the faults hit: every subgroup on the GPU
        std::size_t planned_resident = 0;
        for (std::size_t s = 0; s < sizes.size(); ++s) {
          EXPECT_EQ(report.devices[s], planner::Device::gpu) << s;
          planned_resident += report.planned.subgroups[s].resident ? 1 : 0;
        }
        EXPECT_EQ(planned_resident, resident);
      }
      EXPECT_TRUE(report.not_updated.empty()) << at;
      EXPECT_TRUE(report.unwritten.empty()) << at;
      grads = model.make_gradients(3);
      model.offload_all(executor);
      EXPECT_TRUE(executor.run(hyper(3), policy, headroom).fault.empty()) << at;
      ref.step(grads, hyper(3));
      executor.sync_state(false);
      expect_matches(model, ref);
      return std::pair{stats.copies_h2d + stats.copies_d2h + stats.copies_d2d,
                       stats.kernel_launches};
    };
    const auto [copies, launches] = step_failing(Fail::nothing, 0);
    // A counter each at least (a resident kernel writes the new weights into the model).
    ASSERT_GE(copies, resident);
    ASSERT_GE(launches, sizes.size());
    for (std::uint64_t n = 1; n <= copies; ++n) step_failing(Fail::copy, n);
    for (std::uint64_t n = 1; n <= launches; ++n) step_failing(Fail::launch, n);
  }
};

// Bit for bit, as the reference computes them.
bool same_bits(const float* a, const float* b, std::size_t n) {
  return std::equal(a, a + n, b, [](float x, float y) {
    return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
  });
}

std::uint64_t state_bytes(const OptimizerState& state) {
  std::uint64_t b = 0;
  for (std::size_t s = 0; s < state.size(); ++s) b += state.slot_bytes(s);
  return b;
}

TEST_F(ResidencyTest, ResidentStepsCopyNoStateAndGiveTheReferenceBits) {
  const driver::CurrentContext context;
  Model model(kSizes, /*split_every=*/2);
  Reference ref(*model.state);
  Executor executor(*model.state, resident_options(memory));
  const Policy policy = Policy::automatic_policy();
  for (int step = 1; step <= 4; ++step) {
    auto grads = model.make_gradients(step);
    model.offload_all(executor);
    faults.reset_stats();
    const PhaseReport& report = executor.run(hyper(step), policy, kHeadroom);
    const tide_standin_stats stats = faults.stats();
    ref.step(grads, hyper(step));
    ASSERT_TRUE(report.fault.empty()) << report.fault;
    EXPECT_EQ(report.resident_subgroups, kSizes.size());
    for (std::size_t s = 0; s < kSizes.size(); ++s) {
      EXPECT_TRUE(report.planned.subgroups[s].resident) << s;
      EXPECT_EQ(report.devices[s], planner::Device::gpu) << s;
    }
    std::uint64_t grad_bytes = 0;
    for (std::uint64_t n : kSizes) grad_bytes += 2 * n;
    if (step == 1) {
      // Joining: the state comes in from the pinned slots once, with the gradients.
      EXPECT_EQ(stats.bytes_h2d, grad_bytes + state_bytes(*model.state));
    } else {
      // Nothing: the gradients were kept on the GPU in the backward pass (offloaded device to
      // device before the counters were reset).
      EXPECT_EQ(stats.bytes_h2d, 0u);
    }
    // No state goes out: the non-finite counters only.
    EXPECT_LE(stats.bytes_d2h, 8 * kSizes.size());
    (void)grad_bytes;
    // The pinned slots are a mirror: current only once synced.
    executor.sync_state(/*written=*/false);
    expect_matches(model, ref);
  }
}

// The plan and the report of what ran put the resident updates on the GPU side, ahead of the
// rest, and the joining step's copies of the states in with them: the rate refinement times each
// CPU subgroup against the GPU side it ran beside (a CPU update beside the joins' copies is not
// the CPU's free rate), and the reported prediction is the phase's.
TEST_F(ResidencyTest, TheJoiningStepCountsTheStatesCopiedInOnItsGpuSide) {
  const driver::CurrentContext context;
  Model model(kSizes);
  Reference ref(*model.state);
  Executor executor(*model.state, resident_options(memory));
  const planner::Rates rates = executor.rates();
  // Step 1 copies the states in, and the gradients (the next ones stay on the GPU).
  double join_s = 0, grads_s = 0;
  for (std::size_t s = 0; s < kSizes.size(); ++s) {
    join_s += static_cast<double>(model.state->slot_bytes(s)) / rates.h2d;
    grads_s += static_cast<double>(2 * kSizes[s]) / rates.h2d;
  }
  std::vector<double> planned, ran;
  for (int step = 1; step <= 2; ++step) {
    tide_standin_stats stats;
    all_resident_step(model, executor, ref, step, &stats);
    const PhaseReport& report = executor.last_report();
    EXPECT_EQ(report.ran.gpu_order.size(), kSizes.size());
    EXPECT_TRUE(report.ran.cpu_order.empty());
    for (std::size_t s = 0; s < kSizes.size(); ++s) EXPECT_TRUE(report.ran.subgroups[s].resident);
    planned.push_back(report.planned.predicted.gpu_side_s);
    ran.push_back(report.ran.predicted.gpu_side_s);
  }
  EXPECT_GE(planned[0], join_s);
  EXPECT_GE(ran[0], join_s);
  EXPECT_NEAR(planned[0] - planned[1], join_s + grads_s, 1e-9 + join_s * 1e-9);
  EXPECT_NEAR(ran[0] - ran[1], join_s + grads_s, 1e-9 + join_s * 1e-9);
  executor.sync_state(false);
  expect_matches(model, ref);
}

// Once resident and stale in its pinned slot, a subgroup's kernel writes its new weights into
// the model's parameters itself, each of its slices: a steady step copies nothing but the
// non-finite counters, and the model has the reference's weights.
TEST_F(ResidencyTest, SteadyResidentKernelsWriteTheModelsWeightsThemselves) {
  const driver::CurrentContext context;
  Model model(kSizes, /*split_every=*/2);
  ASSERT_GT(model.state->spec(0).slices.size(), 1u);
  Reference ref(*model.state);
  Executor executor(*model.state, resident_options(memory));
  for (int step = 1; step <= 4; ++step) {
    tide_standin_stats stats{};
    ASSERT_NO_FATAL_FAILURE(all_resident_step(model, executor, ref, step, &stats));
    if (step > 1) {
      EXPECT_EQ(stats.copies_d2d, 0u) << "step " << step;
      EXPECT_EQ(stats.copies_d2h, kSizes.size()) << "step " << step;  // the counters
      // One launch per subgroup, over all of its slices.
      EXPECT_EQ(stats.kernel_launches, kSizes.size()) << "step " << step;
      // The phase's timing events are the last phase's, reused.
      EXPECT_EQ(stats.events_created, 0u) << "step " << step;
      EXPECT_EQ(stats.events_destroyed, 0u) << "step " << step;
    }
  }
  executor.sync_state(/*written=*/false);
  expect_matches(model, ref);
}

// Tensors that do not sit at the state's offsets modulo 8 elements would take a subgroup off
// the kernel's vector path if its kernel wrote them: those subgroups' weights go through the
// lane and a copy, as before; the others' kernels write the model. The weights are the
// reference's either way.
TEST_F(ResidencyTest, KernelsWriteOnlyTheTensorsThatKeepTheirVectorPath) {
  const driver::CurrentContext context;
  // Subgroups 0, 2 and 4 in three tensors, one element apart. Subgroup 2 (777 elements) is off
  // the vector path anyway (its moments are not at a multiple of 8 after its weights).
  Model model(kSizes, /*split_every=*/2, 3, true, Dtype::kFloat32, kernels::StateFormat::kDtype,
              /*slice_gap=*/1);
  Reference ref(*model.state);
  Executor executor(*model.state, resident_options(memory));
  for (int step = 1; step <= 3; ++step) {
    tide_standin_stats stats{};
    ASSERT_NO_FATAL_FAILURE(all_resident_step(model, executor, ref, step, &stats));
    // Subgroups 0 and 4: a copy per tensor.
    if (step > 1) {
      EXPECT_EQ(stats.copies_d2d, 6u) << "step " << step;
    }
  }
  executor.sync_state(/*written=*/false);
  expect_matches(model, ref);
}

TEST_F(ResidencyTest, WritesToTheSyncedMirrorAreTheState) {
  const driver::CurrentContext context;
  Model model(kSizes);
  Executor executor(*model.state, resident_options(memory));
  const Policy policy = Policy::automatic_policy();
  model.make_gradients(1);
  model.offload_all(executor);
  executor.run(hyper(1), policy, kHeadroom);
  ASSERT_EQ(executor.last_report().resident_subgroups, kSizes.size());
  // A program's state surgery between steps: through the mirror, made current and writable.
  executor.sync_state(/*written=*/true);
  for (std::size_t s = 0; s < kSizes.size(); ++s) {
    for (std::uint64_t e = 0; e < kSizes[s]; ++e) {
      static_cast<float*>(model.state->exp_avg(s))[e] = 0;
      model.state->param(s)[e] *= 0.5f;
    }
  }
  Reference ref(*model.state);
  ref.copy = std::vector<std::vector<std::uint16_t>>(kSizes.size());
  for (std::size_t s = 0; s < kSizes.size(); ++s) ref.copy[s].resize(kSizes[s]);
  auto grads = model.make_gradients(2);
  model.offload_all(executor);
  executor.run(hyper(2), policy, kHeadroom);
  ref.step(grads, hyper(2));
  executor.sync_state(false);
  expect_matches(model, ref);
}

TEST_F(ResidencyTest, TheSetFollowsTheHeldMemoryWithHysteresis) {
  const driver::CurrentContext context;
  Model model({4096, 4096, 4096, 4096});
  Reference ref(*model.state);
  ExecutorOptions options = resident_options(memory);
  options.residency_hysteresis = 0.2;
  Executor executor(*model.state, options);
  // What a resident subgroup holds: its state slot and its gradient, kept on the GPU.
  const std::uint64_t slot = model.state->slot_bytes(0) + 4096 * 2;
  const std::uint64_t working = model.state->slot_bytes(0) + 4096 * 4;  // a lane
  // Room for exactly three slots with the working memory: the join limit (80%) admits two.
  const std::uint64_t three = 3 * slot + working;
  auto step_with = [&](int step, std::uint64_t headroom) {
    const PhaseReport& report = synced_step(model, executor, ref, step, headroom);
    const std::size_t resident = report.resident_subgroups;
    for (std::size_t i = 0; i < 4; ++i) {
      EXPECT_TRUE(same_bits(model.state->param(i), ref.p[i].data(), 4096))
          << "step " << step << " subgroup " << i << " device "
          << planner::device_name(report.devices[i]) << " planned resident "
          << report.planned.subgroups[i].resident;
    }
    return resident;
  };
  EXPECT_EQ(step_with(1, three), 2u);
  EXPECT_EQ(step_with(2, three), 2u);                   // steady: no churn
  EXPECT_EQ(step_with(3, 4 * slot + working), 3u);      // grows while under the join limit
  EXPECT_EQ(step_with(4, 3 * slot + working), 3u);      // still fits all of it: stays
  EXPECT_EQ(step_with(5, 3 * slot + working - 1), 2u);  // no longer fits: the last one leaves
  EXPECT_EQ(step_with(6, slot), 0u);                    // nothing fits: all leave
  expect_matches(model, ref);                           // every state is back in its pinned slot
  EXPECT_EQ(executor.residency().bytes(), 0u);
}

// The choice between residency and none keeps the band while states are resident
// (planner::prefer_resident). With room for one resident subgroup beside a lane, and a CPU about
// as fast as the copies, the model puts the plan with it a little behind the plan without (within
// 20%): a fresh executor keeps none resident (the set would admit one), one whose states are all
// resident keeps the one that still fits, and with no band it sends that one home too.
TEST_F(ResidencyTest, ResidencyAgainstNoneKeepsTheBandWhileStatesAreResident) {
  const driver::CurrentContext context;
  const std::uint64_t headroom =
      37 * 4096;  // a lane (16 B/param) and a slot with its gradient (14)
  auto resident_after = [&](double hysteresis, bool all_resident_before) {
    Model model({4096, 4096, 4096, 4096});
    Reference ref(*model.state);
    ExecutorOptions options = resident_options(memory);
    options.rates->cpu_update = 1.2e8;
    options.rates->cpu_update_contended = 1.08e8;
    options.residency_hysteresis = hysteresis;
    Executor executor(*model.state, options);
    int step = 1;
    if (all_resident_before) {
      tide_standin_stats stats;
      all_resident_step(model, executor, ref, step++, &stats);
    }
    const std::size_t resident =
        synced_step(model, executor, ref, step, headroom).resident_subgroups;
    expect_matches(model, ref);
    return resident;
  };
  EXPECT_EQ(resident_after(0.2, false), 0u);
  EXPECT_EQ(resident_after(0.2, true), 1u);
  EXPECT_EQ(resident_after(0.0, true), 0u);
}

// Where only part of the state fits, resident subgroups would take the memory the others need
// to be copied in, and those would go to a slow CPU: the plan without residency is kept.
// Resident updates refine the GPU's rate like any GPU update: where they are slower than the CPU
// (here the stand-in's kernels, run on one host thread, against test rates that call the GPU
// 1e10 params/s) the guard sees it and the state goes home. Found by `make run` on the stand-in's
// CPU mode: every subgroup stayed resident, the update phase 25x slower than on the CPU.
TEST_F(ResidencyTest, SlowResidentUpdatesAreMeasuredAndLeft) {
  const driver::CurrentContext context;
  Model model(kSizes);
  Reference ref(*model.state);
  ExecutorOptions options = resident_options(memory);
  options.refine = true;
  Executor executor(*model.state, options);
  const double assumed = executor.rates().gpu_update;
  std::vector<std::size_t> resident;
  for (int step = 1; step <= 40; ++step) {
    auto grads = model.make_gradients(step);
    model.offload_all(executor);
    const PhaseReport& report = executor.run(hyper(step), Policy::automatic_policy(), kHeadroom);
    ref.step(grads, hyper(step));
    ASSERT_TRUE(report.fault.empty()) << report.fault;
    resident.push_back(report.resident_subgroups);
  }
  EXPECT_EQ(resident.front(), kSizes.size());
  EXPECT_LT(executor.rates().gpu_update, assumed / 10);
  EXPECT_EQ(resident.back(), 0u) << "resident subgroups never left";
  executor.sync_state(false);
  expect_matches(model, ref);
}

TEST_F(ResidencyTest, PartialResidencyThatWouldBeSlowerIsNotTaken) {
  const driver::CurrentContext context;
  Model model({4096, 4096, 4096, 4096});
  Reference ref(*model.state);
  ExecutorOptions options = resident_options(memory);
  options.rates->cpu_update = options.rates->cpu_update_contended = 1e6;  // a very slow CPU
  Executor executor(*model.state, options);
  // Room for one resident subgroup (its slot and gradient, 14 bytes per parameter) with its
  // lane (16), or for two lanes of copied-in subgroups (14 each: state and gradient).
  const std::uint64_t headroom = 4096 * (14 + 16 + 1);  // and the join limit's 5%
  for (int step = 1; step <= 2; ++step) {
    auto grads = model.make_gradients(step);
    model.offload_all(executor);
    const PhaseReport& report = executor.run(hyper(step), Policy::automatic_policy(), headroom);
    ref.step(grads, hyper(step));
    EXPECT_EQ(report.resident_subgroups, 0u);
    EXPECT_EQ(report.ran.gpu_order.size(), 4u);  // all copied in, none left to the CPU
  }
  expect_matches(model, ref);
}

TEST_F(ResidencyTest, FixedPlacementsAndFrozenSlicesKeepNothingResident) {
  const driver::CurrentContext context;
  Model model(kSizes, /*split_every=*/2);
  Reference ref(*model.state);
  Executor executor(*model.state, resident_options(memory));
  for (const Policy& policy : {Policy::all_gpu(), Policy::every(2), Policy::all_cpu()}) {
    model.make_gradients(1);
    model.offload_all(executor);
    const PhaseReport& report = executor.run(hyper(1), policy, kHeadroom);
    EXPECT_EQ(report.resident_subgroups, 0u) << policy_name(policy);
  }
  // Subgroup 0 has three slices: one frozen keeps it out, the others join.
  executor.set_frozen(0, 1, true);
  model.make_gradients(2);
  model.offload_all(executor);
  const PhaseReport& report = executor.run(hyper(2), Policy::automatic_policy(), kHeadroom);
  EXPECT_FALSE(report.planned.subgroups[0].resident);
  EXPECT_EQ(report.resident_subgroups, kSizes.size() - 1);
}

// A copy that fails in a resident phase: no further GPU work, the subgroups not started are
// completed on the CPU from their device state (copied back first), with the same bits.
TEST_F(ResidencyTest, AFailedCopyIsCompletedOnTheCpuFromTheDeviceState) {
  const driver::CurrentContext context;
  // (The last copy is the last subgroup's counters: its update completes in place, nothing is
  // left to roll forward; the sweep below covers it.)
  for (std::uint64_t n : {1, 3}) {
    Model model(kSizes);
    Reference ref(*model.state);
    Executor executor(*model.state, resident_options(memory));
    const Policy policy = Policy::automatic_policy();
    auto grads = step_with_room_then_offload(model, executor, ref, kHeadroom);
    ASSERT_EQ(executor.last_report().resident_subgroups, kSizes.size());
    faults.fail_copy(n);
    const PhaseReport& report = executor.run(hyper(2), policy, kHeadroom);
    faults.fail_copy(0);
    ref.step(grads, hyper(2));
    EXPECT_FALSE(report.fault.empty()) << "copy " << n;
    EXPECT_GT(report.rolled_forward, 0u) << "copy " << n;
    EXPECT_TRUE(report.not_updated.empty()) << "copy " << n;
    // And the next step, from where the CPU left the state.
    grads = model.make_gradients(3);
    model.offload_all(executor);
    EXPECT_TRUE(executor.run(hyper(3), policy, kHeadroom).fault.empty());
    ref.step(grads, hyper(3));
    executor.sync_state(false);
    expect_matches(model, ref);
  }
}

// Every copy, then every kernel launch, of a steady resident step failing in turn (the copies
// are the non-finite counters' and the new weights' writes, enqueued behind each kernel): the
// step completes exactly, the model's weights included, and so does the next one. A kernel that
// was refused leaves its subgroup's state untouched on the device, completed on the CPU; a write
// that was refused is written again at the end of the phase.
TEST_F(ResidencyTest, EveryCopyOrLaunchOfAResidentStepFailingInTurnStillCompletesIt) {
  every_copy_or_launch_failing_in_turn(kSizes, /*split_every=*/2, resident_options(memory),
                                       kHeadroom, kSizes.size());
}

// The same in a plan that mixes resident and copied-in subgroups on one lane, where a copied-in
// subgroup's copy-in waits only for the resident kernel before it on the lane.
TEST_F(ResidencyTest, EveryCopyOrLaunchOfAMixedStepFailingInTurnStillCompletesIt) {
  const driver::CurrentContext context;
  const std::vector<std::uint64_t> sizes(kMixedSubgroups, kMixedParams);
  const Model sizing(sizes);
  every_copy_or_launch_failing_in_turn(sizes, 0, mixed_options(memory),
                                       mixed_headroom(*sizing.state), 2);
}

TEST_F(ResidencyTest, NoMemoryForAJoiningSlotFallsBackToTheCpu) {
  const driver::CurrentContext context;
  // Step 1 holds two subgroups (a lane of the largest, 160000 bytes, and 110000 for slots and
  // kept gradients, 14 bytes per parameter: the join limit admits the first two, 99344 bytes); step
  // 2 has room for all, and an allocation fails: whichever it is (a buffer, a joining subgroup's
  // slot), what it was for is updated on the CPU, exactly; the resident ones stay resident.
  bool joining_failed = false;
  for (std::uint64_t n = 1; n <= 4; ++n) {
    Model model(kSizes);
    Reference ref(*model.state);
    Executor executor(*model.state, resident_options(memory));
    const Policy policy = Policy::automatic_policy();
    for (int step = 1; step <= 3; ++step) {
      auto grads = model.make_gradients(step);
      model.offload_all(executor);
      if (step == 2) faults.fail_alloc(n);
      const PhaseReport& report =
          executor.run(hyper(step), policy, step == 1 ? 160000 + 110000 : kHeadroom);
      faults.fail_alloc(0);
      ref.step(grads, hyper(step));
      EXPECT_TRUE(report.not_updated.empty());
      EXPECT_TRUE(report.fault.empty()) << report.fault;
      if (step == 1) {
        EXPECT_EQ(report.resident_subgroups, 2u);
      }
      if (step == 2 && report.fallback_subgroups > 0 && report.resident_subgroups >= 2 &&
          report.resident_subgroups < kSizes.size()) {
        joining_failed = true;
      }
    }
    executor.sync_state(false);
    expect_matches(model, ref);
  }
  EXPECT_TRUE(joining_failed);
}

// A device lost between steps with resident state: the state since the last mirror is on it
// only. The step cannot complete those subgroups and says so (not_updated); the others are
// updated; and evicting or syncing then fails loudly instead of serving a stale mirror.
TEST_F(ResidencyTest, ALostDeviceLosesOnlyTheUnmirroredStateAndSaysSo) {
  const driver::CurrentContext context;
  Model model(kSizes);
  ExecutorOptions options = resident_options(memory);
  Executor executor(*model.state, options);
  const Policy policy = Policy::automatic_policy();
  model.make_gradients(1);
  model.offload_all(executor);
  executor.run(hyper(1), policy, kHeadroom);
  ASSERT_EQ(executor.last_report().resident_subgroups, kSizes.size());
  model.make_gradients(2);
  model.offload_all(executor);
  executor.ready(hyper(2));  // the gradients are in pinned memory: the step can begin
  faults.device_lost(1);
  const PhaseReport& report = executor.run(hyper(2), policy, kHeadroom);
  EXPECT_FALSE(report.fault.empty());
  EXPECT_EQ(report.not_updated.size(), kSizes.size());
  EXPECT_ANY_THROW(executor.sync_state(false));
  EXPECT_ANY_THROW(executor.evict());
  // The device back, so that the executor and the state can wait for their work and free it
  // (with the device lost they leak it on purpose: queued work may still write it).
  faults.device_lost(0);
}

// Leaving residency does not stop the phase: the states are sent home together, and each
// goes to the CPU once it is there, while the later ones are still on their way (a slow
// device-to-host link here). Before, every leaving state was copied home, one wait each,
// before the phase began.
TEST_F(ResidencyTest, LeavingStatesGoToTheCpuAsEachArrivesHome) {
  const driver::CurrentContext context;
  Model model(kSizes);
  Reference ref(*model.state);
  Executor executor(*model.state, resident_options(memory));
  const Policy policy = Policy::automatic_policy();
  const auto grads = step_with_room_then_offload(model, executor, ref, kHeadroom);
  ASSERT_EQ(executor.last_report().resident_subgroups, kSizes.size());
  faults.set_bandwidth(0, 0.001);  // 1 MB/s home: tens of milliseconds per state
  // No memory may be held: every state leaves, and the CPU updates them all.
  const PhaseReport& report = executor.run(hyper(2), policy, 0);
  faults.set_bandwidth(0, 0);
  ref.step(grads, hyper(2));
  ASSERT_TRUE(report.fault.empty()) << report.fault;
  EXPECT_EQ(report.resident_subgroups, 0u);
  EXPECT_EQ(executor.residency().bytes(), 0u);
  const auto never = PhaseReport::Span{}.end;  // the clock's epoch: not sent home
  auto first_cpu = never, last_home = never;
  for (std::size_t s = 0; s < kSizes.size(); ++s) {
    const PhaseReport::Span& home = report.home_spans[s];
    const PhaseReport::Span& cpu = report.cpu_spans[s];
    ASSERT_NE(home.end, never) << s;
    ASSERT_EQ(report.devices[s], planner::Device::cpu) << s;
    EXPECT_GE(cpu.start, home.end) << "subgroup " << s << " was updated before it was home";
    if (s == 0 || cpu.start < first_cpu) first_cpu = cpu.start;
    last_home = std::max(last_home, home.end);
  }
  EXPECT_LT(first_cpu, last_home) << "the CPU waited for every state to be home";
  expect_matches(model, ref);  // without a sync: the pinned slots hold the state
}

// The device lost at each driver call of a phase in which every state leaves residency: each
// subgroup is updated exactly (its state and gradient came home), or reported not updated with
// its state as it was (home, its gradient lost) or still on the lost device, and then syncing
// the state fails rather than serve a stale mirror.
TEST_F(ResidencyTest, ADeviceLostWhileStatesGoHomeLosesOnlyThoseNotHome) {
  const Policy policy = Policy::automatic_policy();
  auto leave_all = [&](std::uint64_t lose_at) {
    const driver::CurrentContext context;
    Model model(kSizes);
    Reference ref(*model.state);
    Executor executor(*model.state, resident_options(memory));
    const auto grads = step_with_room_then_offload(model, executor, ref, kHeadroom);
    EXPECT_EQ(executor.last_report().resident_subgroups, kSizes.size());
    const Reference before = ref;
    executor.ready(hyper(2));
    ref.step(grads, hyper(2));
    faults.reset_stats();
    faults.device_lost(lose_at);
    const PhaseReport report = executor.run(hyper(2), policy, 0);
    const std::uint64_t calls = faults.stats().driver_calls;
    bool on_lost_device = false;
    for (std::size_t s = 0; s < kSizes.size(); ++s) {
      const std::string at =
          "device lost at call " + std::to_string(lose_at) + ", subgroup " + std::to_string(s);
      const bool updated = std::find(report.not_updated.begin(), report.not_updated.end(), s) ==
                           report.not_updated.end();
      if (executor.residency().resident(s)) {
        EXPECT_FALSE(updated) << at;  // its state stayed on the device, which is lost
        on_lost_device = true;
        continue;
      }
      const Reference& expected = updated ? ref : before;
      const std::size_t bytes = kSizes[s] * model.state->moment_bytes();
      EXPECT_EQ(0, std::memcmp(model.state->param(s), expected.p[s].data(), kSizes[s] * 4)) << at;
      EXPECT_EQ(
          0, std::memcmp(model.state->exp_avg(s), expected.m[s].data() + expected.skip_m[s], bytes))
          << at;
      EXPECT_EQ(0, std::memcmp(model.state->exp_avg_sq(s),
                               expected.v[s].data() + expected.skip_v[s], bytes))
          << at;
    }
    if (lose_at == 0) {
      EXPECT_TRUE(report.not_updated.empty());
    }
    if (!report.not_updated.empty()) {
      EXPECT_FALSE(report.fault.empty());
    }
    if (on_lost_device) {
      EXPECT_ANY_THROW(executor.sync_state(false)) << lose_at;
    }
    faults.device_lost(0);  // so that the executor can wait for its work and free it
    return calls;
  };
  const std::uint64_t calls = leave_all(0);
  ASSERT_GT(calls, 0u);
  for (std::uint64_t n = 1; n <= calls + 1; ++n) leave_all(n);
}

TEST_F(ResidencyTest, EvictBringsEveryStateHomeAndFreesItsMemory) {
  const driver::CurrentContext context;
  Model model(kSizes);
  Reference ref(*model.state);
  Executor executor(*model.state, resident_options(memory));
  auto grads = model.make_gradients(1);
  model.offload_all(executor);
  executor.run(hyper(1), Policy::automatic_policy(), kHeadroom);
  ref.step(grads, hyper(1));
  const std::uint64_t in_use = faults.bytes_in_use();
  const std::uint64_t held = executor.residency().bytes();
  ASSERT_GT(held, 0u);
  EXPECT_GE(executor.evict(model.state->slot_bytes(4)), model.state->slot_bytes(4));
  EXPECT_FALSE(executor.residency().resident(4));  // the last one first
  EXPECT_TRUE(executor.residency().resident(0));
  EXPECT_GT(executor.evict(), 0u);
  EXPECT_EQ(executor.residency().bytes(), 0u);
  EXPECT_EQ(executor.evict(), 0u);  // nothing left
  EXPECT_EQ(faults.bytes_in_use(), in_use - held);
  expect_matches(model, ref);  // without a sync: the pinned slots hold the state again
}

}  // namespace
}  // namespace tide::runtime::testing
