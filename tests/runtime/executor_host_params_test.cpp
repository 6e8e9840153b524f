// Host-resident parameters (OptimizerState::host_params, FSDP2's CPUOffloadPolicy): fp32
// parameters in host memory are their own master weights and the gradients are read where they
// are. Checked against the CPU kernel run directly on copies, bit for bit, under every placement
// (CPU subgroups updated in place, GPU subgroups copied in from the parameters and back through
// the commit); no master copy, gradient buffer or offload; frozen slices untouched; and a step
// with a fault (every copy and allocation failing in turn, the device lost at each call) either
// completes exactly or changes nothing, parameters included.
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>

#include "runtime/gradient_stats.h"
#include "tests/runtime/executor_fixture.h"

namespace tide::runtime::testing {
namespace {

constexpr std::uint64_t kHeadroom = std::uint64_t{1} << 30;
using Faults = allocator::testing::DeviceStandin;

const std::vector<std::uint64_t> kSizes = {3000, 4096, 777, 5000};

// Subgroup i's parameters are params[i], in three parameter tensors for even i (slices), one
// for odd i; its gradients grads[i], fp32 in host memory, as FSDP2 leaves them.
struct HostParams {
  explicit HostParams(Dtype state_dtype = Dtype::kFloat32) {
    std::vector<SubgroupSpec> specs(kSizes.size());
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      const std::uint64_t n = kSizes[i];
      params.emplace_back(n);
      grads.emplace_back(n);
      for (std::uint64_t e = 0; e < n; ++e) params[i][e] = value_at(i, e, 1.0f);
      specs[i].params = n;
      const std::size_t k = i % 2 == 0 ? 3 : 1;
      for (std::size_t p = 0; p < k; ++p) {
        const std::uint64_t begin = n * p / k, end = n * (p + 1) / k;
        specs[i].slices.push_back(ParamSlice{
            begin, end - begin, reinterpret_cast<CUdeviceptr>(params[i].data() + begin)});
      }
    }
    StateOptions options;
    options.grad_dtype = Dtype::kFloat32;
    options.param_dtype = Dtype::kFloat32;
    options.state_dtype = state_dtype;
    options.host_params = true;
    state = std::make_unique<OptimizerState>(std::move(specs), options);
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      for (std::uint64_t e = 0; e < kSizes[i]; ++e) {
        set_moment(state->exp_avg(i), state_dtype, e, value_at(i + 100, e, 0.01f));
        set_moment(state->exp_avg_sq(i), state_dtype, e, std::abs(value_at(i + 200, e, 0.001f)));
      }
    }
  }

  // Gradients of step `step`, handed to the executor slice by slice (none for frozen ones).
  void give_gradients(Executor& executor, int step) {
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      for (std::uint64_t e = 0; e < kSizes[i]; ++e) {
        grads[i][e] = value_at(1000 * step + i, e, 0.5f);
      }
      const auto& slices = state->spec(i).slices;
      for (std::size_t k = 0; k < slices.size(); ++k) {
        executor.set_host_gradient(
            i, k, executor.frozen(i, k) ? nullptr : grads[i].data() + slices[k].offset);
      }
    }
  }

  std::vector<std::vector<float>> params;
  std::vector<std::vector<float>> grads;
  std::unique_ptr<OptimizerState> state;
};

// Parameters and moments, bit for bit.
struct Snapshot {
  std::vector<std::vector<float>> params;
  std::vector<std::vector<char>> moments;

  static Snapshot of(const HostParams& model) {
    Snapshot s;
    s.params = model.params;
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      const auto* m = reinterpret_cast<const char*>(model.state->slot(i));
      s.moments.emplace_back(m, m + model.state->slot_bytes(i));
    }
    return s;
  }
  bool operator==(const Snapshot&) const = default;
};

// The CPU kernel on copies, slice by slice, frozen slices skipped (what the step must give).
Snapshot reference_step(const HostParams& model, const Executor& executor, Snapshot s,
                        const kernels::AdamHyper& h) {
  const unsigned mb = model.state->moment_bytes();
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    const std::uint64_t n = kSizes[i];
    for (std::size_t k = 0; k < model.state->spec(i).slices.size(); ++k) {
      if (executor.frozen(i, k)) continue;
      const ParamSlice& slice = model.state->spec(i).slices[k];
      kernels::AdamSubgroup sub;
      sub.grad = model.grads[i].data() + slice.offset;
      sub.param = s.params[i].data() + slice.offset;
      sub.exp_avg = s.moments[i].data() + slice.offset * mb;
      sub.exp_avg_sq = s.moments[i].data() + n * mb + slice.offset * mb;
      sub.count = slice.count;
      sub.grad_dtype = Dtype::kFloat32;
      sub.state_dtype = model.state->options().state_dtype;
      kernels::cpu_adam_step(sub, h);
    }
  }
  return s;
}

const Policy kPolicies[] = {Policy::all_cpu(), Policy::all_gpu(), Policy::every(2),
                            Policy::automatic_policy()};

struct HostParamsTest : ::testing::Test {
  Faults faults;
  void SetUp() override { faults.hmm(true); }
  void TearDown() override {
    faults.fail_copy(0);
    faults.fail_alloc(0);
    faults.device_lost(0);
    faults.hmm(false);
  }
};

TEST_F(HostParamsTest, NoMasterCopyNoGradientBufferAndNoOffload) {
  const driver::CurrentContext context;
  HostParams model;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    EXPECT_EQ(model.state->param(i), nullptr);
    EXPECT_EQ(model.state->grad(i), nullptr);
    EXPECT_EQ(model.state->weight_copy(i), nullptr);
    EXPECT_EQ(model.state->slot_bytes(i), 8 * kSizes[i]);  // the moments only
  }
  Executor executor(*model.state, options_for_test());
  EXPECT_THROW(executor.offload().offload(0, 0, 0, 1, Dtype::kFloat32, nullptr),
               std::invalid_argument);
  EXPECT_EQ(executor.footprint(false).weight_bytes_per_param, 0u);  // nothing to upload
  // A bf16 parameter is not its own master weights.
  std::vector<std::uint16_t> bf16(16);
  std::vector<SubgroupSpec> specs(1);
  specs[0].params = 16;
  specs[0].slices.push_back({0, 16, reinterpret_cast<CUdeviceptr>(bf16.data())});
  StateOptions options;
  options.host_params = true;  // with the default bf16 parameters
  EXPECT_THROW(OptimizerState(specs, options), std::invalid_argument);
}

// bf16 master weights need bf16 parameters, host-resident ones are fp32: asking for both is
// refused, and the message says that, not which parameter dtype one of them wanted.
TEST_F(HostParamsTest, BF16MasterWeightsAreRefusedByName) {
  const driver::CurrentContext context;
  for (const Dtype param_dtype : {Dtype::kFloat32, Dtype::kBFloat16}) {
    std::vector<float> params(16);
    std::vector<SubgroupSpec> specs(1);
    specs[0].params = 16;
    specs[0].slices.push_back({0, 16, reinterpret_cast<CUdeviceptr>(params.data())});
    StateOptions options;
    options.param_dtype = options.grad_dtype = param_dtype;
    options.host_params = true;
    options.master_dtype = Dtype::kBFloat16;
    try {
      OptimizerState state(specs, options);
      ADD_FAILURE() << "host_params with bf16 master weights was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("host-resident"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bf16 master"), std::string::npos) << e.what();
    }
  }
}

void steps_match_reference(const Policy& policy, Dtype state_dtype) {
  SCOPED_TRACE(policy_name(policy));
  const driver::CurrentContext context;
  HostParams model(state_dtype);
  Executor executor(*model.state, options_for_test());
  Snapshot expected = Snapshot::of(model);
  for (int step = 1; step <= 3; ++step) {
    model.give_gradients(executor, step);
    expected = reference_step(model, executor, expected, hyper(step));
    const PhaseReport& r = executor.run(hyper(step), policy, kHeadroom);
    EXPECT_TRUE(r.fault.empty()) << r.fault;
    EXPECT_TRUE(r.unwritten.empty());
    if (policy.kind == Policy::Kind::gpu) {
      EXPECT_EQ(r.ran.gpu_order.size(), kSizes.size());
    } else if (policy.kind == Policy::Kind::cpu) {
      EXPECT_EQ(r.ran.gpu_order.size(), 0u);
    } else {
      EXPECT_GT(r.ran.gpu_order.size(), 0u);  // auto with these rates, and one in two
    }
    ASSERT_TRUE(Snapshot::of(model) == expected) << "step " << step;
    // The gradients are forgotten with the step: the next needs new ones.
    EXPECT_EQ(executor.host_gradient(0, 0), nullptr);
  }
}

TEST_F(HostParamsTest, StepsMatchTheCpuKernelUnderEveryPlacement) {
  for (const Policy& policy : kPolicies) steps_match_reference(policy, Dtype::kFloat32);
  for (const Policy& policy : {Policy::all_gpu(), Policy::every(2)}) {
    steps_match_reference(policy, Dtype::kBFloat16);
  }
}

// fp32 weights are the state: a lane's next subgroup never waits behind it, so the commit that
// frees the lane must start the next one at once. Found by tide.torch with an fp32 model and
// resident subgroups on one lane: every subgroup after the first waited the coordinator's poll
// interval (20 ms), 8 subgroups 165 ms instead of 21. The interval is an hour here: a phase that
// depends on it never ends within the test's time.
TEST_F(HostParamsTest, ACommitThatFreesTheOnlyLaneStartsTheNextSubgroup) {
  const driver::CurrentContext context;
  HostParams model;
  ExecutorOptions options = options_for_test();
  options.planner.max_buffers = 1;
  options.poll_interval = std::chrono::hours(1);
  Executor executor(*model.state, options);
  Snapshot expected = Snapshot::of(model);
  model.give_gradients(executor, 1);
  expected = reference_step(model, executor, expected, hyper(1));
  const PhaseReport& r = executor.run(hyper(1), Policy::all_gpu(), kHeadroom);
  EXPECT_TRUE(r.fault.empty()) << r.fault;
  EXPECT_EQ(r.ran.gpu_order.size(), kSizes.size());
  EXPECT_EQ(r.ran.buffers, 1u);
  EXPECT_TRUE(Snapshot::of(model) == expected);
}

TEST_F(HostParamsTest, FrozenSlicesAreLeftAsTheyAre) {
  for (const Policy& policy : {Policy::all_cpu(), Policy::all_gpu()}) {
    SCOPED_TRACE(policy_name(policy));
    const driver::CurrentContext context;
    HostParams model;
    Executor executor(*model.state, options_for_test());
    executor.set_frozen(0, 1, true);  // the middle parameter of subgroup 0
    model.give_gradients(executor, 1);
    const Snapshot before = Snapshot::of(model);
    const Snapshot expected = reference_step(model, executor, before, hyper(1));
    const PhaseReport& r = executor.run(hyper(1), policy, kHeadroom);
    EXPECT_EQ(r.nonfinite, 0u);
    EXPECT_TRUE(Snapshot::of(model) == expected);
    const ParamSlice& frozen = model.state->spec(0).slices[1];
    EXPECT_EQ(0, std::memcmp(model.params[0].data() + frozen.offset,
                             before.params[0].data() + frozen.offset, frozen.count * 4));
  }
}

TEST_F(HostParamsTest, AMissingGradientThrowsBeforeAnythingChanged) {
  const driver::CurrentContext context;
  HostParams model;
  Executor executor(*model.state, options_for_test());
  model.give_gradients(executor, 1);
  executor.set_host_gradient(2, 1, nullptr);  // neither a gradient nor frozen
  const Snapshot before = Snapshot::of(model);
  EXPECT_THROW(executor.run(hyper(1), Policy::all_gpu(), kHeadroom), std::invalid_argument);
  EXPECT_TRUE(Snapshot::of(model) == before);
}

TEST_F(HostParamsTest, GradientStatsReadTheGradientsWhereTheyAre) {
  const driver::CurrentContext context;
  HostParams model;
  Executor executor(*model.state, options_for_test());
  model.give_gradients(executor, 1);
  model.grads[1][7] = std::numeric_limits<float>::infinity();
  double sum = 0;
  for (const auto& g : model.grads) {
    for (float x : g) {
      if (std::isfinite(x)) sum += static_cast<double>(x) * x;
    }
  }
  const GradientStats stats = executor.gradient_stats();
  EXPECT_EQ(stats.nonfinite, 1u);
  EXPECT_NEAR(stats.sum_squares, sum, 1e-9 * sum);
}

// Counts what one fault-free phase of `policy` does, from `field` of the stand-in's counters.
template <typename Field>
std::uint64_t events_in_a_phase(const Faults& faults, const Policy& policy, Field field) {
  const driver::CurrentContext context;
  HostParams model;
  Executor executor(*model.state, options_for_test());
  model.give_gradients(executor, 1);
  executor.ready(hyper(1));
  const std::uint64_t before = field(faults.stats());
  executor.run(hyper(1), policy, kHeadroom);
  return field(faults.stats()) - before;
}

void step_with_fault(const Faults& faults, const Policy& policy, const std::function<void()>& arm,
                     const std::string& what) {
  SCOPED_TRACE(policy_name(policy) + ", " + what);
  const driver::CurrentContext context;
  HostParams model;
  Executor executor(*model.state, options_for_test());
  model.give_gradients(executor, 1);
  const Snapshot before = Snapshot::of(model);
  const Snapshot after = reference_step(model, executor, before, hyper(1));
  arm();
  bool threw = false;
  PhaseReport report;
  try {
    report = executor.run(hyper(1), policy, kHeadroom);
  } catch (const std::exception&) {
    threw = true;
  }
  EXPECT_TRUE(report.not_updated.empty());
  EXPECT_TRUE(report.unwritten.empty());  // the parameters are written on the host, always
  const Snapshot at_return = Snapshot::of(model);
  faults.fail_copy(0);
  faults.fail_alloc(0);
  faults.device_lost(0);
  executor.release_buffers();  // waits for what a lost device left queued (the stand-in runs it)
  EXPECT_TRUE(Snapshot::of(model) == at_return) << "something changed after run() returned";
  if (threw) {
    EXPECT_TRUE(at_return == before) << "a step that threw changed something";
    model.give_gradients(executor, 1);
    executor.run(hyper(1), policy, kHeadroom);
  } else {
    EXPECT_TRUE(at_return == after)
        << "a completed step is not the reference's (fault: " << report.fault << ")";
  }
  // Training goes on: the next step is the reference's.
  model.give_gradients(executor, 2);
  const Snapshot next = reference_step(model, executor, after, hyper(2));
  executor.run(hyper(2), policy, kHeadroom);
  EXPECT_TRUE(Snapshot::of(model) == next);
}

TEST_F(HostParamsTest, EveryCopyOrAllocationFailingInTurnStillCompletesTheStep) {
  for (const Policy& policy : {Policy::all_gpu(), Policy::every(2)}) {
    const std::uint64_t copies = events_in_a_phase(faults, policy, [](const tide_standin_stats& s) {
      return s.copies_h2d + s.copies_d2h + s.copies_d2d;
    });
    ASSERT_GT(copies, 0u);
    for (std::uint64_t n = 1; n <= copies + 1; ++n) {
      step_with_fault(
          faults, policy, [&] { faults.fail_copy(n); }, "copy " + std::to_string(n));
    }
    const std::uint64_t allocations = events_in_a_phase(
        faults, policy,
        [](const tide_standin_stats& s) { return s.device_allocs + s.mem_creates; });
    for (std::uint64_t n = 1; n <= allocations + 1; ++n) {
      step_with_fault(
          faults, policy, [&] { faults.fail_alloc(n); }, "allocation " + std::to_string(n));
    }
  }
}

TEST_F(HostParamsTest, DeviceLostAtEachCallEndsInOneOfTheTwoStates) {
  const Policy policy = Policy::every(2);
  const std::uint64_t calls =
      events_in_a_phase(faults, policy, [](const tide_standin_stats& s) { return s.driver_calls; });
  ASSERT_GT(calls, 0u);
  for (std::uint64_t n = 1; n <= calls + 1; ++n) {
    step_with_fault(
        faults, policy, [&] { faults.device_lost(n); }, "device lost at call " + std::to_string(n));
  }
}

}  // namespace
}  // namespace tide::runtime::testing
