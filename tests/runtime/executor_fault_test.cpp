// Memory pressure mid-phase: a GPU buffer that cannot be allocated sends its subgroup to the
// CPU; results stay exact, nothing leaks, the next plan gets less headroom, training continues.
#include "tests/runtime/executor_fixture.h"

namespace tide::runtime::testing {
namespace {

constexpr std::uint64_t kHeadroom = std::uint64_t{1} << 30;

struct FaultTest : ::testing::Test {
  // An executor over a model of `sizes` subgroups (every `split_every`-th split in three tensors),
  // with the reference and the device memory in use before any phase.
  struct Run {
    Run(const FaultTest& test, const std::vector<std::uint64_t>& sizes, std::size_t split_every,
        const ExecutorOptions& options)
        : model(sizes, split_every),
          ref(*model.state),
          executor(*model.state, options),
          baseline(test.standin.bytes_in_use()) {}
    // The gradients of `step`, produced on the device and offloaded.
    std::vector<std::vector<std::uint16_t>> gradients(int step) {
      auto grads = model.make_gradients(step);
      model.offload_all(executor);
      return grads;
    }
    // The phase just run did the reference's step `step` on `grads`, bit for bit.
    void expect_exact(const std::vector<std::vector<std::uint16_t>>& grads, int step) {
      ref.step(grads, hyper(step));
      expect_matches(model, ref);
    }

    const driver::CurrentContext context;
    Model model;
    Reference ref;
    Executor executor;
    std::uint64_t baseline;
  };

  static ExecutorOptions options() {
    ExecutorOptions o;
    o.rates = test_rates();
    return o;
  }

  void TearDown() override { standin.fail_alloc(0); }

  allocator::testing::DeviceStandin standin;
};

// Allocation order within a phase: the nonfinite counters, then buffer 0, 1, ...
TEST_F(FaultTest, BufferAllocationFailureFallsBackToTheCpu) {
  Run run(*this, std::vector<std::uint64_t>(6, 4096), /*split_every=*/3, options());
  auto grads = run.gradients(1);
  standin.fail_alloc(3);  // the second buffer
  const PhaseReport& r1 = run.executor.run(hyper(1), Policy::all_gpu(), kHeadroom);
  ASSERT_GE(r1.planned.buffers, 2u);
  EXPECT_EQ(r1.fallback_subgroups, 1u);
  EXPECT_EQ(r1.ran.gpu_order.size(), 5u);
  EXPECT_EQ(r1.ran.buffers, 1u);
  EXPECT_GT(r1.headroom_cap, 0u);
  EXPECT_LT(r1.headroom_cap, kHeadroom);
  run.expect_exact(grads, 1);
  EXPECT_EQ(standin.bytes_in_use(), run.baseline);

  // The next plan shrinks to what could be allocated; training continues.
  const planner::Plan next = run.executor.plan_for(Policy::automatic_policy(), kHeadroom);
  EXPECT_LE(next.gpu_bytes(), r1.headroom_cap);
  grads = run.gradients(2);
  const PhaseReport& r2 = run.executor.run(hyper(2), Policy::all_gpu(), kHeadroom);
  EXPECT_EQ(r2.fallback_subgroups, 0u);
  run.expect_exact(grads, 2);
  // The buffers are kept for the next phase: it allocates nothing.
  EXPECT_GT(standin.bytes_in_use(), run.baseline);
  const std::uint64_t allocations = standin.device_allocations();
  run.model.offload_all(run.executor);
  run.executor.run(hyper(3), Policy::all_gpu(), kHeadroom);
  EXPECT_EQ(standin.device_allocations(), allocations);
  run.executor.release_buffers();
  EXPECT_EQ(standin.bytes_in_use(), run.baseline);
}

TEST_F(FaultTest, NoBufferAtAllRunsEverythingOnTheCpu) {
  for (std::uint64_t nth : {1, 2}) {  // the counters, then the first buffer
    Run run(*this, std::vector<std::uint64_t>(4, 2048), /*split_every=*/0, options());
    auto grads = run.gradients(1);
    standin.fail_alloc(nth);
    const PhaseReport& r = run.executor.run(hyper(1), Policy::every(2), kHeadroom);
    EXPECT_EQ(r.fallback_subgroups, 2u);
    EXPECT_TRUE(r.ran.gpu_order.empty());
    run.expect_exact(grads, 1);
    EXPECT_EQ(standin.bytes_in_use(), run.baseline);
  }
}

// Gradients kept on the GPU whose subgroup falls back: brought to host memory first.
TEST_F(FaultTest, FallbackWithGradientsKeptOnTheGpu) {
  ExecutorOptions kept = options();
  kept.gradients_on_gpu = KeptGradients::yes;
  Run run(*this, std::vector<std::uint64_t>(4, 4096), /*split_every=*/0, kept);
  run.executor.prepare(Policy::all_gpu(), kHeadroom);
  auto grads = run.gradients(1);
  standin.fail_alloc(1);  // the counters: every GPU subgroup falls back
  const PhaseReport& r = run.executor.run(hyper(1), Policy::all_gpu(), kHeadroom);
  EXPECT_EQ(r.fallback_subgroups, 4u);
  run.expect_exact(grads, 1);
  EXPECT_EQ(standin.bytes_in_use(), run.baseline);
}

// The cap on later plans after a fallback is the GPU memory the phase held, the gradients kept
// on the GPU included (found by bench_iteration: without them the cap was the counters' few
// bytes, and plans stayed all-CPU for dozens of phases while it grew back by a quarter a phase).
TEST_F(FaultTest, TheCapAfterAFallbackCountsTheGradientsKeptOnTheGpu) {
  ExecutorOptions kept = options();
  kept.gradients_on_gpu = KeptGradients::yes;
  kept.refine = false;
  Run run(*this, std::vector<std::uint64_t>(4, 4096), /*split_every=*/0, kept);
  const planner::Plan& prepared = *run.executor.prepare(Policy::all_gpu(), kHeadroom);
  ASSERT_EQ(prepared.resident_bytes, 4u * 4096 * 2);
  auto grads = run.gradients(1);
  standin.fail_alloc(2);  // the counters are allocated, the first buffer is not
  const PhaseReport& r = run.executor.run(hyper(1), Policy::all_gpu(), kHeadroom);
  EXPECT_EQ(r.fallback_subgroups, 4u);
  EXPECT_GE(r.headroom_cap, prepared.resident_bytes);
  EXPECT_LT(r.headroom_cap, kHeadroom);
  run.expect_exact(grads, 1);
  EXPECT_EQ(standin.bytes_in_use(), run.baseline);
}

TEST_F(FaultTest, BuffersAPhaseDoesNotUseStayKeptWithinItsHeadroom) {
  ExecutorOptions fixed = options();
  fixed.refine = false;
  Run run(*this, std::vector<std::uint64_t>(6, 4096), /*split_every=*/0, fixed);
  auto phase = [&](const Policy& policy, std::uint64_t headroom) {
    run.gradients(1);
    return run.executor.run(hyper(1), policy, headroom);
  };
  const PhaseReport many = phase(Policy::all_gpu(), kHeadroom);
  ASSERT_GE(many.planned.buffers, 2u);
  const std::uint64_t held = standin.bytes_in_use();
  // Fewer buffers, then none (all-CPU), then as many again: nothing allocated after the first.
  const std::uint64_t allocations = standin.device_allocations();
  EXPECT_EQ(phase(Policy::every(6), kHeadroom).ran.buffers, 1u);
  EXPECT_EQ(phase(Policy::all_cpu(), kHeadroom).ran.buffers, 0u);
  EXPECT_EQ(standin.bytes_in_use(), held);
  EXPECT_EQ(phase(Policy::all_gpu(), kHeadroom).ran.buffers, many.planned.buffers);
  EXPECT_EQ(standin.device_allocations(), allocations);
  // A headroom that no longer holds them all: what does not fit is freed.
  const std::uint64_t buffer = many.planned.buffer_bytes;
  phase(Policy::every(6), buffer + buffer / 2);
  EXPECT_EQ(standin.bytes_in_use(), held - (many.planned.buffers - 1) * buffer);
  phase(Policy::all_cpu(), 0);
  EXPECT_LT(standin.bytes_in_use(), held - (many.planned.buffers - 1) * buffer);
  run.executor.release_buffers();
  EXPECT_EQ(standin.bytes_in_use(), run.baseline);
}

}  // namespace
}  // namespace tide::runtime::testing
