// Memory pressure mid-phase: a GPU buffer that cannot be allocated sends its subgroup to the
// CPU; results stay exact, nothing leaks, the next plan gets less headroom, training continues.
#include "executor_fixture.h"

namespace tide::scheduler::testing {
namespace {

constexpr std::uint64_t kHeadroom = std::uint64_t{1} << 30;

struct FaultTest : ::testing::Test {
  allocator::testing::DeviceStandin standin;
  void TearDown() override { standin.fail_alloc(0); }
};

// Allocation order within a phase: the nonfinite counters, then buffer 0, 1, ...
TEST_F(FaultTest, BufferAllocationFailureFallsBackToTheCpu) {
  driver::PrimaryContext context;
  Model model(std::vector<std::uint64_t>(6, 4096), /*split_every=*/3);
  Reference ref(*model.state);
  ExecutorOptions options;
  options.rates = test_rates();
  Executor executor(*model.state, options);
  const std::uint64_t baseline = standin.bytes_in_use();

  auto grads = model.make_gradients(1);
  model.offload_all(executor);
  standin.fail_alloc(3);  // the second buffer
  const PhaseReport& r1 = executor.run(hyper(1), Policy::all_gpu(), kHeadroom);
  ASSERT_GE(r1.planned.buffers, 2u);
  EXPECT_EQ(r1.fallback_subgroups, 1u);
  EXPECT_EQ(r1.ran.gpu_order.size(), 5u);
  EXPECT_EQ(r1.ran.buffers, 1u);
  EXPECT_GT(r1.headroom_cap, 0u);
  EXPECT_LT(r1.headroom_cap, kHeadroom);
  ref.step(grads, hyper(1));
  expect_matches(model, ref);
  EXPECT_EQ(standin.bytes_in_use(), baseline);

  // The next plan shrinks to what could be allocated; training continues.
  const Plan next = executor.plan_for(Policy::automatic_policy(), kHeadroom);
  EXPECT_LE(next.gpu_bytes(), r1.headroom_cap);
  grads = model.make_gradients(2);
  model.offload_all(executor);
  const PhaseReport& r2 = executor.run(hyper(2), Policy::all_gpu(), kHeadroom);
  EXPECT_EQ(r2.fallback_subgroups, 0u);
  ref.step(grads, hyper(2));
  expect_matches(model, ref);
  // The buffers are kept for the next phase: it allocates nothing.
  EXPECT_GT(standin.bytes_in_use(), baseline);
  const std::uint64_t allocations = standin.device_allocations();
  model.offload_all(executor);
  executor.run(hyper(3), Policy::all_gpu(), kHeadroom);
  EXPECT_EQ(standin.device_allocations(), allocations);
  executor.release_buffers();
  EXPECT_EQ(standin.bytes_in_use(), baseline);
}

TEST_F(FaultTest, NoBufferAtAllRunsEverythingOnTheCpu) {
  for (std::uint64_t nth : {1, 2}) {  // the counters, then the first buffer
    driver::PrimaryContext context;
    Model model(std::vector<std::uint64_t>(4, 2048));
    Reference ref(*model.state);
    ExecutorOptions options;
    options.rates = test_rates();
    Executor executor(*model.state, options);
    const std::uint64_t baseline = standin.bytes_in_use();
    auto grads = model.make_gradients(1);
    model.offload_all(executor);
    standin.fail_alloc(nth);
    const PhaseReport& r = executor.run(hyper(1), Policy::every(2), kHeadroom);
    EXPECT_EQ(r.fallback_subgroups, 2u);
    EXPECT_TRUE(r.ran.gpu_order.empty());
    ref.step(grads, hyper(1));
    expect_matches(model, ref);
    EXPECT_EQ(standin.bytes_in_use(), baseline);
  }
}

// Gradients kept on the GPU whose subgroup falls back: brought to host memory first.
TEST_F(FaultTest, FallbackWithGradientsKeptOnTheGpu) {
  driver::PrimaryContext context;
  Model model(std::vector<std::uint64_t>(4, 4096));
  Reference ref(*model.state);
  ExecutorOptions options;
  options.rates = test_rates();
  options.gradients_on_gpu = true;
  Executor executor(*model.state, options);
  const std::uint64_t baseline = standin.bytes_in_use();
  auto grads = model.make_gradients(1);
  executor.prepare(Policy::all_gpu(), kHeadroom);
  model.offload_all(executor);
  standin.fail_alloc(1);  // the counters: every GPU subgroup falls back
  const PhaseReport& r = executor.run(hyper(1), Policy::all_gpu(), kHeadroom);
  EXPECT_EQ(r.fallback_subgroups, 4u);
  ref.step(grads, hyper(1));
  expect_matches(model, ref);
  EXPECT_EQ(standin.bytes_in_use(), baseline);
}

TEST_F(FaultTest, BuffersAPhaseDoesNotUseStayKeptWithinItsHeadroom) {
  driver::PrimaryContext context;
  Model model(std::vector<std::uint64_t>(6, 4096));
  ExecutorOptions options;
  options.rates = test_rates();
  options.refine = false;
  Executor executor(*model.state, options);
  const std::uint64_t baseline = standin.bytes_in_use();
  auto phase = [&](const Policy& policy, std::uint64_t headroom) {
    model.make_gradients(1);
    model.offload_all(executor);
    return executor.run(hyper(1), policy, headroom);
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
  executor.release_buffers();
  EXPECT_EQ(standin.bytes_in_use(), baseline);
}

}  // namespace
}  // namespace tide::scheduler::testing
