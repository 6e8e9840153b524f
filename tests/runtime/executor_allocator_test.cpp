// The executor under tide's caching allocator: its GPU buffers are carved from the allocator's
// cache (memory the forward and backward passes freed, which the driver does not count as free),
// and the telemetry's update-phase peak, from which the next headroom is forecast, leaves them out.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "allocator/device/device_registry.h"
#include "tests/runtime/executor_fixture.h"

namespace tide::runtime::testing {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::size_t kSubgroups = 6;
constexpr std::uint64_t kParams = 256 * 1024;  // a buffer: 14 bytes per parameter, 3.5 MiB

struct ExecutorAllocatorTest : AllocatorDeviceTest {
  void SetUp() override {
    // 64 MiB of device memory; the model's parameters and gradients take 6 MiB.
    standin.set_capacity(64 * kMiB);
    model = std::make_unique<Model>(std::vector<std::uint64_t>(kSubgroups, kParams), 3);
    allocator = &allocator::device::device_allocator(0);
    // What a forward and backward pass leave behind: 54 MiB of large blocks and a small one
    // freed into the cache; the driver's free memory is less than one buffer.
    void* activations = allocator->allocate(54 * kMiB, nullptr);
    void* small = allocator->allocate(4096, nullptr);
    ASSERT_NE(activations, nullptr);
    ASSERT_NE(small, nullptr);
    allocator->deallocate(activations, 54 * kMiB, nullptr);
    allocator->deallocate(small, 4096, nullptr);
    ASSERT_LT(driver::memory_info().free_bytes, 14 * kParams);
  }

  // `n` marked iterations whose forward pass peaks at `activations` bytes, for the forecast.
  void iterations_seen(int n, std::size_t activations) {
    using allocator::telemetry::Mark;
    for (int i = 0; i < n; ++i) {
      allocator->mark(Mark::kForward);
      void* p = allocator->allocate(activations, nullptr);
      ASSERT_NE(p, nullptr);
      allocator->mark(Mark::kBackward);
      allocator->deallocate(p, activations, nullptr);
      allocator->mark(Mark::kUpdate);
      allocator->mark(Mark::kIterationEnd);
    }
  }
};

TEST_F(ExecutorAllocatorTest, BuffersComeFromTheAllocatorsCache) {
  Reference ref(*model->state);
  ExecutorOptions options;
  options.rates = test_rates();
  Executor executor(*model->state, options);
  const std::uint64_t reserved = allocator->usage().reserved;

  allocator->mark(allocator::telemetry::Mark::kUpdate);
  auto grads = model->make_gradients(1);
  model->offload_all(executor);
  const PhaseReport& r = executor.run(hyper(1), Policy::all_gpu(), 48 * kMiB);
  ASSERT_GE(r.planned.buffers, 2u);
  EXPECT_EQ(r.fallback_subgroups, 0u);
  EXPECT_EQ(r.ran.gpu_order.size(), kSubgroups);
  ref.step(grads, hyper(1));
  expect_matches(*model, ref);
  // Out of the cache: the allocator took nothing more from the driver, and holds the buffers.
  EXPECT_EQ(allocator->usage().reserved, reserved);
  EXPECT_GE(allocator->usage().live, r.planned.buffers * 14 * kParams);
  executor.release_buffers();
  EXPECT_EQ(allocator->usage().live, 0u);
  allocator->mark(allocator::telemetry::Mark::kIterationEnd);

  // The update phase's peak leaves the buffers out (so the next headroom does not shrink by
  // them); the timeline shows them.
  const std::vector<allocator::telemetry::IterationStats> its = allocator->iterations();
  ASSERT_FALSE(its.empty());
  EXPECT_EQ(its.back().peak_live[static_cast<int>(allocator::telemetry::Phase::kUpdate)], 0u);
  std::uint64_t highest = 0;
  for (const allocator::telemetry::Sample& s : allocator->timeline())
    highest = std::max(highest, s.live);
  EXPECT_GE(highest, r.planned.buffers * 14 * kParams);
  EXPECT_EQ(allocator->headroom().update_peak, 0u);
}

TEST_F(ExecutorAllocatorTest, DriverMemoryAloneFallsBackToTheCpu) {
  // The same phase with the buffers from cuMemAlloc (what the executor did before it used the
  // allocator): the cache holds the memory, the buffers do not fit, the subgroups go to the CPU.
  Reference ref(*model->state);
  allocator::DriverResource driver_memory;
  ExecutorOptions options;
  options.rates = test_rates();
  options.memory = &driver_memory;
  Executor executor(*model->state, options);
  auto grads = model->make_gradients(1);
  model->offload_all(executor);
  const PhaseReport& r = executor.run(hyper(1), Policy::all_gpu(), 48 * kMiB);
  EXPECT_GT(r.fallback_subgroups, 0u);
  ref.step(grads, hyper(1));
  expect_matches(*model, ref);
}

TEST_F(ExecutorAllocatorTest, KeptGradientsComeFromTheCacheToo) {
  // Kept gradients are held through the passes: no more than the forecast allows. A window's
  // worth of small passes, so that another test's iterations (say, a forward pass that left no
  // room) are out of it.
  allocator->mark(allocator::telemetry::Mark::kIterationEnd);
  ASSERT_NO_FATAL_FAILURE(iterations_seen(5, kMiB));
  Reference ref(*model->state);
  ExecutorOptions options;
  options.rates = test_rates();
  options.gradients_on_gpu = KeptGradients::yes;
  Executor executor(*model->state, options);
  const planner::Plan& plan = *executor.prepare(Policy::all_gpu(), 48 * kMiB);
  ASSERT_EQ(plan.gpu_order.size(), kSubgroups);
  EXPECT_GE(allocator->usage().live, kSubgroups * 2 * kParams);  // the kept bf16 gradients
  auto grads = model->make_gradients(1);
  model->offload_all(executor);
  const PhaseReport& r = executor.run(hyper(1), Policy::all_gpu(), 48 * kMiB);
  EXPECT_EQ(r.fallback_subgroups, 0u);
  EXPECT_EQ(r.ran.gpu_order.size(), kSubgroups);
  ref.step(grads, hyper(1));
  expect_matches(*model, ref);
}

// KeptGradients::automatic (the default of tide.torch and the C ABI) keeps the gradients on the
// GPU where the forecast says they may be held through the passes and the model predicts the
// phase no slower that way, and otherwise prepares nothing: the phase plans with its own
// headroom and copies the gradients in from pinned memory.
struct AutomaticKeptGradients : ExecutorAllocatorTest {
  // The forecast of `n` iterations whose passes peaked at `activations` (the window's worth, so
  // that other tests' iterations are out of it), then an executor and its prepared plan.
  const planner::Plan* prepare_after(std::size_t activations) {
    allocator->mark(allocator::telemetry::Mark::kIterationEnd);
    iterations_seen(5, activations);
    options.rates = test_rates();
    options.gradients_on_gpu = KeptGradients::automatic;
    executor = std::make_unique<Executor>(*model->state, options);
    ref = std::make_unique<Reference>(*model->state);
    return prepare_now();
  }
  const planner::Plan* prepare_now() {
    return executor->prepare(Policy::automatic_policy(), allocator->headroom().held_headroom);
  }
  // Subgroups whose gradient goes to a GPU buffer now.
  std::vector<std::size_t> kept() const {
    std::vector<std::size_t> out;
    for (std::size_t s = 0; s < kSubgroups; ++s) {
      if (executor->offload().device_gradient(s) != 0) out.push_back(s);
    }
    return out;
  }
  // Backward and the phase, with the update's headroom as tide.torch gives it; exact.
  const PhaseReport& finish() {
    auto grads = model->make_gradients(1);
    model->offload_all(*executor);
    const PhaseReport& r =
        executor->run(hyper(1), Policy::automatic_policy(), allocator->headroom().headroom);
    EXPECT_TRUE(r.fault.empty()) << r.fault;
    ref->step(grads, hyper(1));
    expect_matches(*model, *ref);
    executor->release_buffers();
    return r;
  }
  ExecutorOptions options;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<Reference> ref;
};

TEST_F(AutomaticKeptGradients, WhereMemoryAllowsTheGpuSubgroupsKeepThem) {
  const planner::Plan* plan = prepare_after(8 * kMiB);
  ASSERT_NE(plan, nullptr) << "room for every lane and kept gradient, and no copy of them in";
  ASSERT_FALSE(plan->gpu_order.empty());
  std::vector<std::size_t> gpu = plan->gpu_order;
  std::sort(gpu.begin(), gpu.end());
  EXPECT_EQ(kept(), gpu);
  EXPECT_GE(allocator->usage().live, gpu.size() * 2 * kParams);
  const PhaseReport& r = finish();
  EXPECT_EQ(r.ran.gpu_order.size(), gpu.size());
  EXPECT_EQ(r.fallback_subgroups, 0u);
}

// The passes peak at 50 MiB: what may be held through them has room for the kept gradients and
// one lane, which the model predicts slower than the lanes of the update phase's own headroom.
TEST_F(AutomaticKeptGradients, WhereTheyWouldCostLanesNothingIsPrepared) {
  const planner::Plan* plan = prepare_after(50 * kMiB);
  const allocator::telemetry::HeadroomForecast f = allocator->headroom();
  ASSERT_GT(f.held_headroom, 14 * kParams + 3 * 2 * kParams);
  ASSERT_LT(f.held_headroom, 2 * 14 * kParams);
  ASSERT_GT(f.headroom, 4 * 14 * kParams);
  EXPECT_EQ(plan, nullptr);
  EXPECT_TRUE(kept().empty());
  EXPECT_EQ(allocator->usage().live, 0u);
  const PhaseReport& r = finish();
  EXPECT_FALSE(r.ran.gpu_order.empty()) << "planned with the update's headroom";
  EXPECT_EQ(r.fallback_subgroups, 0u);
}

// At 54 MiB not even one lane fits beside a kept gradient: the same.
TEST_F(AutomaticKeptGradients, WhereNoLaneFitsBesideThemNothingIsPrepared) {
  const planner::Plan* plan = prepare_after(54 * kMiB);
  const allocator::telemetry::HeadroomForecast f = allocator->headroom();
  ASSERT_LT(f.held_headroom, 14 * kParams + 2 * kParams);
  ASSERT_GT(f.headroom, 2 * 14 * kParams);
  EXPECT_EQ(plan, nullptr);
  EXPECT_TRUE(kept().empty());
  const PhaseReport& r = finish();
  EXPECT_FALSE(r.ran.gpu_order.empty()) << "planned with the update's headroom";
  EXPECT_EQ(r.fallback_subgroups, 0u);
}

// A device lost at any driver call of the phase: every subgroup is still updated exactly. The
// kept gradients reached pinned memory too, which step() waited for before anything changed, so
// a GPU subgroup the device cannot finish is redone on the CPU. Before, it was reported not
// updated (TIDE_STEP_INCOMPLETE), as it still is with KeptGradients::yes.
TEST_F(AutomaticKeptGradients, ADeviceLostDuringThePhaseLosesNoGradient) {
  auto phase_losing_at = [&](std::uint64_t n) {
    const std::string at = "device lost at call " + std::to_string(n);
    executor.reset();
    ref.reset();
    model.reset();
    allocator->empty_cache();
    model = std::make_unique<Model>(std::vector<std::uint64_t>(kSubgroups, kParams), 3);
    const planner::Plan* plan = prepare_after(8 * kMiB);
    EXPECT_NE(plan, nullptr) << at;
    auto grads = model->make_gradients(1);
    model->offload_all(*executor);
    executor->ready(hyper(1));
    const std::uint64_t headroom = allocator->headroom().headroom;
    standin.reset_stats();
    standin.device_lost(n);
    const PhaseReport r = executor->run(hyper(1), Policy::automatic_policy(), headroom);
    const std::uint64_t calls = standin.stats().driver_calls;
    standin.device_lost(0);
    EXPECT_TRUE(r.not_updated.empty()) << at << ": " << r.fault;
    for (std::size_t s : r.unwritten) executor->write_params(s);
    ref->step(grads, hyper(1));
    expect_matches(*model, *ref);
    executor->release_buffers();
    return calls;
  };
  const std::uint64_t calls = phase_losing_at(0);
  ASSERT_GT(calls, 0u);
  for (std::uint64_t n = 1; n <= calls + 1; ++n) phase_losing_at(n);
}

// Without tide's allocator nothing forecasts what the passes need, and nothing could take the
// buffers back from them: nothing is kept, however roomy the headroom given.
TEST_F(AutomaticKeptGradients, WithoutTidesAllocatorNothingIsPrepared) {
  allocator::DriverResource driver_memory;
  options.memory = &driver_memory;
  EXPECT_EQ(prepare_after(8 * kMiB), nullptr);
  EXPECT_TRUE(kept().empty());
}

// bench_iteration's varying_tight variant died with "out of device memory allocating 200000
// bytes" when the published variant's best K was 3: that static configuration prepared its kept
// gradients with the headroom measured in the roomy memory state; in the tight one they still fit,
// and left the forward pass's activations no room. Kept gradients are held through the forward
// pass: prepare() keeps no more than the allocator's forecast says may be held.
TEST_F(ExecutorAllocatorTest, KeptGradientsLeaveTheForwardPassItsRoom) {
  using allocator::telemetry::Mark;
  // An iteration seen: the forward pass peaks at 40 MiB of activations.
  ASSERT_NO_FATAL_FAILURE(iterations_seen(1, 40 * kMiB));
  // Another tenant of the device takes memory: 42 MiB are left to tide, room for the forward pass
  // and little more.
  allocator->empty_cache();
  const driver::DeviceBuffer tenant(driver::memory_info().free_bytes - 42 * kMiB);

  Reference ref(*model->state);
  ExecutorOptions options;
  options.rates = test_rates();
  options.gradients_on_gpu = KeptGradients::yes;
  Executor executor(*model->state, options);
  // A headroom measured when memory was roomy (a static configuration's): the kept gradients
  // (6 x 512 KiB) would fit now, and leave the forward pass 2 MiB short.
  executor.prepare(Policy::all_gpu(), 48 * kMiB);
  allocator->mark(Mark::kForward);
  void* activations = allocator->allocate(40 * kMiB, nullptr);
  EXPECT_NE(activations, nullptr) << "the kept gradients took the forward pass's memory";
  allocator->mark(Mark::kBackward);
  if (activations != nullptr) allocator->deallocate(activations, 40 * kMiB, nullptr);
  allocator->mark(Mark::kUpdate);
  auto grads = model->make_gradients(1);
  model->offload_all(executor);
  executor.run(hyper(1), Policy::all_gpu(), 48 * kMiB);
  allocator->mark(Mark::kIterationEnd);
  ref.step(grads, hyper(1));
  expect_matches(*model, ref);
  executor.release_buffers();
}

// What a forward pass past the forecast meets: an iteration was seen whose passes peaked at 40
// MiB, then another tenant of the device left tide 48 MiB, and a prepared all-GPU plan kept its
// GPU subgroups' gradients in what the forecast says may be held (a lane and kept gradients).
struct KeptGradientsPastTheForecast : ExecutorAllocatorTest {
  void SetUp() override {
    ExecutorAllocatorTest::SetUp();
    using allocator::telemetry::Mark;
    // As many such iterations as the forecast's window: what other tests ran is out of it.
    allocator->mark(Mark::kIterationEnd);
    ASSERT_NO_FATAL_FAILURE(iterations_seen(5, 40 * kMiB));
    allocator->empty_cache();
    tenant.emplace(driver::memory_info().free_bytes - 48 * kMiB);
    options.rates = test_rates();
    options.gradients_on_gpu = KeptGradients::yes;
    executor = std::make_unique<Executor>(*model->state, options);
    ref = std::make_unique<Reference>(*model->state);
    kept = executor->prepare(Policy::all_gpu(), 48 * kMiB)->gpu_order;
    ASSERT_GT(kept.size(), 1u) << "the forecast leaves room for kept gradients";
    allocator->mark(Mark::kForward);
  }
  void TearDown() override {
    executor.reset();
    tenant.reset();
    ExecutorAllocatorTest::TearDown();
  }
  // The subgroups of `kept` whose gradients go to pinned memory now.
  std::vector<std::size_t> withdrawn() const {
    std::vector<std::size_t> out;
    for (std::size_t s : kept) {
      if (executor->offload().device_gradient(s) == 0) out.push_back(s);
    }
    return out;
  }
  // The rest of the iteration: backward, then the phase; it completes exactly.
  const PhaseReport& finish() {
    using allocator::telemetry::Mark;
    allocator->mark(Mark::kBackward);
    allocator->mark(Mark::kUpdate);
    auto grads = model->make_gradients(1);
    model->offload_all(*executor);
    const PhaseReport& r = executor->run(hyper(1), Policy::all_gpu(), 48 * kMiB);
    allocator->mark(Mark::kIterationEnd);
    EXPECT_TRUE(r.fault.empty()) << r.fault;
    ref->step(grads, hyper(1));
    expect_matches(*model, *ref);
    executor->release_buffers();
    return r;
  }

  std::optional<driver::DeviceBuffer> tenant;
  ExecutorOptions options;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<Reference> ref;
  std::vector<std::size_t> kept;
};

// A forward pass that needs more than the kept gradients leave (a longer sequence) gets them all
// back, before any of them held a gradient: their subgroups' gradients go to pinned memory, and
// the phase copies them in as without kept gradients. Failed before: the allocation failed.
TEST_F(KeptGradientsPastTheForecast, AForwardPassTakesThemBackInsteadOfFailing) {
  ASSERT_GE(allocator->usage().live, kept.size() * 2 * kParams);
  const std::size_t longer = 48 * kMiB - kept.size() * 2 * kParams + kMiB;
  void* activations = allocator->allocate(longer, nullptr);
  EXPECT_NE(activations, nullptr) << "the kept gradients took the forward pass's memory";
  EXPECT_TRUE(allocator->ooms().empty());
  EXPECT_EQ(withdrawn(), kept);
  if (activations != nullptr) allocator->deallocate(activations, longer, nullptr);
  const PhaseReport& r = finish();
  EXPECT_EQ(r.pressure.withdrawn_gradients, kept.size());
  EXPECT_EQ(r.pressure.withdrawn_bytes, kept.size() * 2 * kParams);
  EXPECT_EQ(r.pressure.evicted_subgroups, 0u);
}

// Where the pass needs only some of them back, the last subgroups' go first; those subgroups are
// updated on the CPU (the plan's lanes have no room for a gradient), the others on the GPU with
// the gradients they kept.
TEST_F(KeptGradientsPastTheForecast, SomeGoBackAndTheirSubgroupsRunOnTheCpu) {
  std::vector<void*> blocks;
  while (withdrawn().empty()) {
    void* p = allocator->allocate(2 * kMiB, nullptr);
    ASSERT_NE(p, nullptr) << "after " << blocks.size() << " blocks";
    blocks.push_back(p);
  }
  const std::vector<std::size_t> back = withdrawn();
  ASSERT_LT(back.size(), kept.size());
  std::vector<std::size_t> last = kept;  // the last subgroups' go first
  std::sort(last.begin(), last.end());
  last.erase(last.begin(), last.end() - static_cast<std::ptrdiff_t>(back.size()));
  std::vector<std::size_t> back_sorted = back;
  std::sort(back_sorted.begin(), back_sorted.end());
  EXPECT_EQ(back_sorted, last);
  EXPECT_TRUE(allocator->ooms().empty());
  for (void* p : blocks) allocator->deallocate(p, 2 * kMiB, nullptr);
  const PhaseReport& r = finish();
  EXPECT_EQ(r.pressure.withdrawn_gradients, back.size());
  for (std::size_t s : kept) {
    const bool went_back = std::find(back.begin(), back.end(), s) != back.end();
    EXPECT_EQ(r.devices[s], went_back ? planner::Device::cpu : planner::Device::gpu) << s;
  }
}

}  // namespace
}  // namespace tide::runtime::testing

namespace tide::runtime::testing {
namespace {

// Resident state under tide's allocator, 64 MiB of device memory: the model takes 6 MiB, and
// iterations whose passes peaked at 16 MiB of activations make the held headroom forecast (what
// may be held through an iteration) room for the whole state, 18 MiB.
struct ExecutorAllocatorResidency : AllocatorDeviceTest {
  void SetUp() override {
    standin.set_capacity(64 * kMiB);
    model = std::make_unique<Model>(std::vector<std::uint64_t>(kSubgroups, kParams), 3);
    allocator = &allocator::device::device_allocator(0);
    // What other tests allocated since their last mark ends here (an iteration without an update
    // phase, which the forecast skips); then as many iterations as the forecast's window.
    allocator->mark(allocator::telemetry::Mark::kIterationEnd);
    for (int i = 0; i < 5; ++i) {
      allocator->mark(allocator::telemetry::Mark::kForward);
      void* activations = allocator->allocate(16 * kMiB, nullptr);
      ASSERT_NE(activations, nullptr);
      allocator->deallocate(activations, 16 * kMiB, nullptr);
      allocator->mark(allocator::telemetry::Mark::kUpdate);
      allocator->mark(allocator::telemetry::Mark::kIterationEnd);
    }
    ASSERT_GT(allocator->headroom().held_headroom, 30 * kMiB);
    options.rates = test_rates();
    options.refine = false;
    options.residency = true;
  }

  // One marked iteration: a forward pass whose freed blocks cannot serve what it asks next (20
  // MiB freed, 22 MiB asked), then an automatic phase at `step`. `released`: whether the forward
  // pass made the allocator give its cache back.
  void fragmenting_iteration(Executor& executor, Reference& ref, int step, PhaseReport* report,
                             bool* released) {
    using allocator::telemetry::Mark;
    const std::uint64_t releases = allocator->usage().cache_releases;
    allocator->mark(Mark::kForward);
    void* a = allocator->allocate(20 * kMiB, nullptr);
    void* b = allocator->allocate(2 * kMiB, nullptr);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    allocator->deallocate(a, 20 * kMiB, nullptr);
    void* c = allocator->allocate(22 * kMiB, nullptr);
    ASSERT_NE(c, nullptr) << "step " << step;
    allocator->mark(Mark::kBackward);
    allocator->deallocate(b, 2 * kMiB, nullptr);
    allocator->deallocate(c, 22 * kMiB, nullptr);
    *released = allocator->usage().cache_releases > releases;
    allocator->mark(Mark::kUpdate);
    auto grads = model->make_gradients(step);
    model->offload_all(executor);
    *report = executor.run(hyper(step), Policy::automatic_policy(), 40 * kMiB);
    ref.step(grads, hyper(step));
    executor.release_buffers();
    allocator->mark(Mark::kIterationEnd);
  }

  ExecutorOptions options;
};

// An allocation that would fail because of resident state takes it back home first (the
// executor's reclaimer), and succeeds; no out-of-memory is recorded, and the state is intact in
// its pinned slots.
TEST_F(ExecutorAllocatorResidency, AnAllocationThatWouldFailEvictsResidentStateInstead) {
  allocator::device::CachingAllocator& a = *allocator;
  Reference ref(*model->state);
  Executor executor(*model->state, options);
  auto grads = model->make_gradients(1);
  model->offload_all(executor);
  const PhaseReport& r = executor.run(hyper(1), Policy::automatic_policy(), 40 * kMiB);
  ref.step(grads, hyper(1));
  ASSERT_EQ(r.resident_subgroups, kSubgroups);
  executor.release_buffers();
  const std::size_t ooms = a.ooms().size();

  // The next forward pass needs more than the resident state leaves.
  const std::uint64_t want = 48 * kMiB;
  ASSERT_LT(driver::memory_info().free_bytes + (a.usage().reserved - a.usage().live), want);
  void* big = a.allocate(want, nullptr);
  ASSERT_NE(big, nullptr);
  EXPECT_LT(executor.residency().count(), kSubgroups);
  EXPECT_EQ(a.ooms().size(), ooms);
  executor.sync_state(false);  // the evicted state is home; the rest comes with it
  expect_matches(*model, ref);
  a.deallocate(big, want, nullptr);

  // The forecast missed that pressure once, so what it took back does not rejoin at the next
  // phase (the next forward pass could take it again); it rejoins once phases have passed
  // without pressure, and the steps go on exactly.
  const std::size_t stayed = executor.residency().count();
  std::vector<std::size_t> counts;
  std::string releases_seen;
  for (int step = 2; step <= 20; ++step) {
    grads = model->make_gradients(step);
    model->offload_all(executor);
    const PhaseReport& report = executor.run(hyper(step), Policy::automatic_policy(), 40 * kMiB);
    counts.push_back(report.resident_subgroups);
    releases_seen += std::to_string(report.pressure.cache_releases) + " ";
    // The next step's report says what the pressure before it took back, and only that one.
    if (step == 2) {
      EXPECT_EQ(report.pressure.evicted_subgroups, kSubgroups - stayed);
      EXPECT_EQ(report.pressure.evicted_bytes,
                (kSubgroups - stayed) * model->state->slot_bytes(kSubgroups - 1));
      EXPECT_GT(report.pressure.evict_seconds, 0.0);
    } else {
      EXPECT_EQ(report.pressure.evicted_subgroups, 0u) << "step " << step;
      EXPECT_EQ(report.pressure.evicted_bytes, 0u) << "step " << step;
      EXPECT_EQ(report.pressure.evict_seconds, 0.0) << "step " << step;
    }
    ref.step(grads, hyper(step));
    executor.release_buffers();
  }
  std::string series;
  for (std::size_t c : counts) series += std::to_string(c) + " ";
  SCOPED_TRACE("resident by step: " + series + "; cache releases before each: " + releases_seen);
  EXPECT_EQ(counts.front(), stayed);
  EXPECT_TRUE(std::is_sorted(counts.begin(), counts.end()));
  EXPECT_EQ(counts.back(), kSubgroups);
  executor.sync_state(false);
  expect_matches(*model, ref);
}

// A forward pass that needs more than the forecast says, every step (the allocator's forecast
// counts live bytes; what fragmentation reserves under a cap it does not see): resident state is
// taken back once, not at every step to rejoin at the next phase (the H200's capped iterations
// spent 25 ms more outside the update phase than a fixed placement with the same update).
TEST_F(ExecutorAllocatorResidency, PressureTheForecastMissesTakesStateBackOnceNotEveryStep) {
  Reference ref(*model->state);
  Executor executor(*model->state, options);
  int evictions = 0;
  for (int step = 1; step <= 12; ++step) {
    if (step > 1) {  // a forward pass the forecast does not see (no marks): 48 MiB
      const std::size_t before = executor.residency().count();
      void* big = allocator->allocate(48 * kMiB, nullptr);
      ASSERT_NE(big, nullptr) << "step " << step;
      evictions += executor.residency().count() < before ? 1 : 0;
      allocator->deallocate(big, 48 * kMiB, nullptr);
    }
    auto grads = model->make_gradients(step);
    model->offload_all(executor);
    const PhaseReport& r = executor.run(hyper(step), Policy::automatic_policy(), 40 * kMiB);
    if (step == 1) {
      ASSERT_EQ(r.resident_subgroups, kSubgroups);
    }
    ref.step(grads, hyper(step));
    executor.release_buffers();
  }
  // Once at the first, and at most once more when the cap is tried again after quiet phases.
  EXPECT_GE(evictions, 1);
  EXPECT_LE(evictions, 2);
  executor.sync_state(false);
  expect_matches(*model, ref);
}

// Forward passes whose live bytes fit beside the resident state but whose blocks do not: what
// they free cannot serve what they ask next (20 MiB freed, 22 MiB asked), the allocator maps more
// at each step, and at its limit it serves them only by giving its whole cache back (a device
// synchronize, unmapping and mapping again). Nothing fails, so nothing is reclaimed, and the
// forecast (live bytes) sees no pressure: without a reaction it went on every few steps with all
// six subgroups resident. Each such release costs the residency budget a quarter.
TEST_F(ExecutorAllocatorResidency, ForwardPassesThatReleaseTheCacheShrinkResidency) {
  Reference ref(*model->state);
  Executor executor(*model->state, options);
  std::size_t resident = 0, releasing_steps = 0;
  for (int step = 1; step <= 20; ++step) {
    PhaseReport r;
    bool released = false;
    ASSERT_NO_FATAL_FAILURE(fragmenting_iteration(executor, ref, step, &r, &released));
    // The phase reports the cache releases of the passes before it.
    EXPECT_EQ(r.pressure.cache_releases > 0, released) << "step " << step;
    if (step == 1) {
      ASSERT_EQ(r.resident_subgroups, kSubgroups);
    } else if (released && resident > 0) {
      ++releasing_steps;
      EXPECT_LT(r.resident_subgroups, resident) << "step " << step << " released the cache";
    }
    resident = r.resident_subgroups;
  }
  EXPECT_GE(releasing_steps, 1u);  // the pattern does squeeze the cache
  executor.sync_state(false);
  expect_matches(*model, ref);
}

// The same forward passes for longer: they settle. The executor's buffers are freed on its
// compute stream; had the allocator to wait for an event to hand them to the forward pass's
// stream, the forward pass would find them only after growing beside them, by 2 MiB at every
// step, and release the cache at its limit again and again (every few steps, at 40 steps). The
// executor waits for its streams when it releases its buffers, and says so to the allocator.
TEST_F(ExecutorAllocatorResidency, ForwardPassesBesideResidentStateSettle) {
  Reference ref(*model->state);
  Executor executor(*model->state, options);
  std::vector<std::uint64_t> releases;
  for (int step = 1; step <= 40; ++step) {
    PhaseReport r;
    bool released = false;
    ASSERT_NO_FATAL_FAILURE(fragmenting_iteration(executor, ref, step, &r, &released));
    releases.push_back(allocator->usage().cache_releases);
  }
  // The last 20 steps: at most one release. Growing 2 MiB a step, the cache would reach its limit
  // several times in 20. One may remain: after quiet phases the residency budget grows again, and
  // whether the grown set meets the same pressure depends on how many lanes the phases took
  // (commits that come sooner or later on a loaded machine), and the wait before the next
  // attempt doubles (8, then 16 phases): seen under three runs at once, with and without the
  // asynchronous leaving.
  EXPECT_LE(releases.back() - releases[19], 1u);
  EXPECT_GT(executor.residency().count(), 0u);
  executor.sync_state(false);
  expect_matches(*model, ref);
}

}  // namespace
}  // namespace tide::runtime::testing
