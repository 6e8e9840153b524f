// A step happens exactly, or not at all, whatever fails inside it: every copy and every device
// allocation of one phase made to fail in turn, and the device lost at each driver call of one
// phase, under every placement. After each, the optimizer state and the model's parameters are
// bit for bit either the reference's step or what they were before, the state does not change
// after run() returns or throws (the parameters may still receive the committed values from work
// a lost device left queued, on the stand-in), and training goes on to the reference's next step.
//
// The model's parameters live in host memory that the stand-in addresses (its HMM mode, as
// tide.torch's CPU mode uses): the test can read them while the device is lost, and see a late
// write if one landed.
#include <algorithm>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>

#include "tests/runtime/executor_fixture.h"

namespace tide::runtime::testing {
namespace {

constexpr std::uint64_t kHeadroom = std::uint64_t{1} << 30;

// The stand-in's fault injection and counters, through the library tide loaded.
using Faults = allocator::testing::DeviceStandin;

// A model whose bf16 parameters are host memory (HMM); gradients are produced in device memory.
struct HostModel {
  explicit HostModel(const std::vector<std::uint64_t>& sizes, Dtype state_dtype = Dtype::kFloat32,
                     Dtype master_dtype = Dtype::kFloat32)
      : sizes_(sizes) {
    std::vector<SubgroupSpec> specs(sizes.size());
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::uint64_t n = sizes[i];
      params.emplace_back(n);
      grads.emplace_back(n * 2);
      specs[i].params = n;
      // Every other subgroup in three parameter tensors.
      const std::size_t k = i % 2 == 0 ? 3 : 1;
      for (std::size_t p = 0; p < k; ++p) {
        const std::uint64_t begin = n * p / k, end = n * (p + 1) / k;
        specs[i].slices.push_back(ParamSlice{
            begin, end - begin, reinterpret_cast<CUdeviceptr>(params[i].data() + begin)});
      }
    }
    StateOptions options;
    options.state_dtype = state_dtype;
    options.master_dtype = master_dtype;
    state = std::make_unique<OptimizerState>(std::move(specs), options);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      for (std::uint64_t e = 0; e < sizes[i]; ++e) {
        const float w = value_at(i, e, 1.0f);
        if (state->bf16_master()) {
          // bf16 weights and a compensation holding what their rounding lost.
          state->master_bf16(i)[e] = kernels::float_to_bf16(w);
          state->master_comp(i)[e] =
              kernels::float_to_bf16(w - kernels::bf16_to_float(state->master_bf16(i)[e]));
        } else {
          state->param(i)[e] = w;
        }
        set_moment(state->exp_avg(i), state_dtype, e, value_at(i + 100, e, 0.01f));
        set_moment(state->exp_avg_sq(i), state_dtype, e, std::abs(value_at(i + 200, e, 0.001f)));
        params[i][e] = kernels::float_to_bf16(w);
      }
    }
  }

  std::vector<std::vector<std::uint16_t>> make_gradients(int step) {
    std::vector<std::vector<std::uint16_t>> g(sizes_.size());
    for (std::size_t i = 0; i < sizes_.size(); ++i) {
      g[i].resize(sizes_[i]);
      for (std::uint64_t e = 0; e < sizes_[i]; ++e) {
        g[i][e] = kernels::float_to_bf16(value_at(1000 * step + i, e, 0.5f));
      }
      driver::copy_to_device(grads[i].get(), g[i].data(), sizes_[i] * 2);
    }
    return g;
  }

  void offload_all(Executor& executor) {
    for (std::size_t i = 0; i < sizes_.size(); ++i) {
      executor.offload().offload(i, 0, grads[i].get(), sizes_[i], Dtype::kBFloat16, nullptr);
    }
  }

  std::vector<std::uint64_t> sizes_;
  std::vector<std::vector<std::uint16_t>> params;
  std::vector<driver::DeviceBuffer> grads;
  std::unique_ptr<OptimizerState> state;
};

// Everything a step may change: state (its slot's bytes: master weights, then the moments of
// the state dtype) and model parameters, bit for bit.
struct Snapshot {
  std::vector<std::vector<char>> state;
  std::vector<std::vector<std::uint16_t>> params;

  static Snapshot of(const HostModel& model, bool with_params = true) {
    Snapshot s;
    for (std::size_t i = 0; i < model.sizes_.size(); ++i) {
      const auto* p = reinterpret_cast<const char*>(model.state->param(i));
      s.state.emplace_back(p, p + model.state->slot_bytes(i));
      if (with_params) s.params.push_back(model.params[i]);
    }
    return s;
  }
  static Snapshot of(const Reference& ref) {
    Snapshot s;
    for (std::size_t i = 0; i < ref.p.size(); ++i) {
      const auto* p = reinterpret_cast<const char*>(ref.p[i].data());
      std::vector<char> all(p, p + 4 * ref.p[i].size());
      all.insert(all.end(), ref.m[i].begin(), ref.m[i].end());
      all.insert(all.end(), ref.v[i].begin(), ref.v[i].end());
      s.state.push_back(std::move(all));
      s.params.push_back(ref.copy[i]);
    }
    return s;
  }
  bool operator==(const Snapshot&) const = default;
};

// The reference's weights are its copies; before its first step, the initial bf16 parameters.
Reference reference_of(const HostModel& model) {
  Reference ref(*model.state);
  ref.copy = model.params;
  return ref;
}

const Policy kPolicies[] = {Policy::all_cpu(), Policy::all_gpu(), Policy::every(2),
                            Policy::automatic_policy()};

const std::vector<std::uint64_t> kSizes = {3000, 4096, 777, 5000};

struct StepFaultTest : ::testing::Test {
  Faults faults;
  void SetUp() override { faults.hmm(true); }
  void TearDown() override {
    faults.fail_copy(0);
    faults.fail_alloc(0);
    faults.device_lost(0);
    faults.hmm(false);
  }
};

// The longest sweeps run once per placement (and step, and moments), each a test of its own, so
// that ctest's shards of this test (tests/runtime/CMakeLists.txt) share them out.
struct Sweep {
  Policy policy;
  int first = 1;  // the faulty step's number
  Dtype moments = Dtype::kFloat32;
};

std::string sweep_name(const ::testing::TestParamInfo<Sweep>& info) {
  const Sweep& s = info.param;
  std::string name = policy_name(s.policy) + "_step" + std::to_string(s.first);
  if (s.moments == Dtype::kBFloat16) name += "_bf16_moments";
  return name;
}

void PrintTo(const Sweep& s, std::ostream* os) {
  *os << policy_name(s.policy) << ", step " << s.first
      << (s.moments == Dtype::kBFloat16 ? ", bf16 moments" : "");
}

struct SweepTest : StepFaultTest, ::testing::WithParamInterface<Sweep> {};
struct Bf16MasterCopySweep : SweepTest {};
struct Bf16MasterDeviceLostSweep : SweepTest {};
struct DeviceLostSweep : SweepTest {};

// Counts what one fault-free phase of `policy` does, from `field` of the stand-in's counters.
template <typename Field>
std::uint64_t events_in_a_phase(const Faults& faults, const Policy& policy, Field field,
                                Dtype state_dtype = Dtype::kFloat32,
                                Dtype master_dtype = Dtype::kFloat32, int first = 1) {
  const driver::CurrentContext context;
  HostModel model(kSizes, state_dtype, master_dtype);
  Executor executor(*model.state, options_for_test());
  for (int step = 1; step < first; ++step) {
    model.make_gradients(step);
    model.offload_all(executor);
    executor.run(hyper(step), policy, kHeadroom);
  }
  model.make_gradients(first);
  model.offload_all(executor);
  executor.ready(hyper(first));
  const std::uint64_t before = field(faults.stats());
  executor.run(hyper(first), policy, kHeadroom);
  return field(faults.stats()) - before;
}

// One step with the fault armed by `arm` right before it; checks the outcome, then a second
// step without fault. `first`: the faulty step's number (the steps before it run without fault).
void step_with_fault(const Faults& faults, const Policy& policy, const std::function<void()>& arm,
                     const std::string& what, Dtype state_dtype = Dtype::kFloat32,
                     Dtype master_dtype = Dtype::kFloat32, int first = 1) {
  SCOPED_TRACE(policy_name(policy) + ", " + what);
  const driver::CurrentContext context;
  HostModel model(kSizes, state_dtype, master_dtype);
  Reference ref = reference_of(model);
  Executor executor(*model.state, options_for_test());
  for (int step = 1; step < first; ++step) {
    const auto g = model.make_gradients(step);
    model.offload_all(executor);
    executor.run(hyper(step), policy, kHeadroom);
    ref.step(g, hyper(step));
  }
  auto grads = model.make_gradients(first);
  model.offload_all(executor);
  const Snapshot before = Snapshot::of(model);
  Reference after_ref = ref;
  after_ref.step(grads, hyper(first));
  const Snapshot after = Snapshot::of(after_ref);

  arm();
  bool threw = false;
  PhaseReport report;
  try {
    report = executor.run(hyper(first), policy, kHeadroom);
  } catch (const std::exception&) {
    threw = true;
  }
  EXPECT_TRUE(report.not_updated.empty());
  // The state right after the call: no queued work ever writes it, so it may be read at once.
  const Snapshot state_at_return = Snapshot::of(model, /*with_params=*/false);
  // Work queued before a device loss still runs on the stand-in (a real GPU runs none): once the
  // device is back, release_buffers() waits for all of it. Only then are the parameters read:
  // such late work may still write them, with the committed values.
  faults.fail_copy(0);
  faults.fail_alloc(0);
  faults.device_lost(0);
  executor.release_buffers();
  EXPECT_TRUE(Snapshot::of(model, false) == state_at_return)
      << "the state changed after run() returned";
  // The caller writes what the executor could not (tide.torch does, with torch): the bf16
  // rounding of the committed master weights, or bf16 master weights as they are.
  for (std::size_t s : report.unwritten) {
    for (std::uint64_t e = 0; e < kSizes[s]; ++e) {
      model.params[s][e] = model.state->bf16_master()
                               ? model.state->master_bf16(s)[e]
                               : kernels::float_to_bf16(model.state->param(s)[e]);
    }
  }
  const Snapshot now = Snapshot::of(model);
  if (threw) {
    EXPECT_TRUE(now == before) << "a step that threw changed something";
  } else {
    EXPECT_TRUE(now == after) << "a completed step is not the reference's (fault: " << report.fault
                              << ")";
  }
  if (threw) {
    // Not happened: the same step again.
    report = executor.run(hyper(first), policy, kHeadroom);
    EXPECT_TRUE(Snapshot::of(model) == after);
  }
  // Training goes on: the next step is the reference's.
  grads = model.make_gradients(first + 1);
  model.offload_all(executor);
  executor.run(hyper(first + 1), policy, kHeadroom);
  after_ref.step(grads, hyper(first + 1));
  EXPECT_TRUE(Snapshot::of(model) == Snapshot::of(after_ref));
}

TEST_F(StepFaultTest, EveryCopyOfAPhaseFailingInTurnStillCompletesTheStep) {
  for (const Policy& policy : kPolicies) {
    const std::uint64_t copies = events_in_a_phase(faults, policy, [](const tide_standin_stats& s) {
      return s.copies_h2d + s.copies_d2h + s.copies_d2d;
    });
    ASSERT_GT(copies, 0u);
    for (std::uint64_t n = 1; n <= copies + 1; ++n) {
      step_with_fault(
          faults, policy, [&] { faults.fail_copy(n); }, "copy " + std::to_string(n));
    }
  }
}

// The same with bf16 moments (8 state bytes per parameter in the slots, buffers and copies),
// under the placements that copy: all on the GPU, and one in two.
TEST_F(StepFaultTest, EveryCopyFailingInTurnWithBf16MomentsStillCompletesTheStep) {
  for (const Policy& policy : {Policy::all_gpu(), Policy::every(2)}) {
    const std::uint64_t copies = events_in_a_phase(
        faults, policy,
        [](const tide_standin_stats& s) { return s.copies_h2d + s.copies_d2h + s.copies_d2d; },
        Dtype::kBFloat16);
    ASSERT_GT(copies, 0u);
    for (std::uint64_t n = 1; n <= copies + 1; ++n) {
      step_with_fault(
          faults, policy, [&] { faults.fail_copy(n); }, "bf16 moments, copy " + std::to_string(n),
          Dtype::kBFloat16);
    }
  }
}

TEST_F(StepFaultTest, DeviceLostAtEachCallWithBf16MomentsEndsInOneOfTheTwoStates) {
  const Policy policy = Policy::every(2);
  const std::uint64_t calls = events_in_a_phase(
      faults, policy, [](const tide_standin_stats& s) { return s.driver_calls; }, Dtype::kBFloat16);
  ASSERT_GT(calls, 0u);
  for (std::uint64_t n = 1; n <= calls + 1; ++n) {
    step_with_fault(
        faults, policy, [&] { faults.device_lost(n); },
        "bf16 moments, device lost at call " + std::to_string(n), Dtype::kBFloat16);
  }
}

// bf16 master weights with compensation: the model's parameters are the master weights, so a
// step that fails must leave them (and the compensation and moments: the whole slot) as they
// were, or complete them exactly. Every copy failing in turn, under the placements that copy,
// with fp32 and bf16 moments; at the first step (the weights copied in from host memory) and at
// the second (taken from the model's parameters on the device: only the compensation and the
// moments are copied in).
TEST_P(Bf16MasterCopySweep, EveryCopyFailingInTurnStillCompletesTheStep) {
  const auto [policy, first, moments] = GetParam();
  const std::uint64_t copies = events_in_a_phase(
      faults, policy,
      [](const tide_standin_stats& s) { return s.copies_h2d + s.copies_d2h + s.copies_d2d; },
      moments, Dtype::kBFloat16, first);
  ASSERT_GT(copies, 0u);
  for (std::uint64_t n = 1; n <= copies + 1; ++n) {
    step_with_fault(
        faults, policy, [&] { faults.fail_copy(n); },
        "bf16 master, step " + std::to_string(first) + ", copy " + std::to_string(n), moments,
        Dtype::kBFloat16, first);
  }
}

std::vector<Sweep> bf16_master_copy_sweeps() {
  std::vector<Sweep> sweeps;
  for (const int first : {1, 2}) {
    for (const Dtype moments : {Dtype::kFloat32, Dtype::kBFloat16}) {
      for (const Policy& policy : {Policy::all_gpu(), Policy::every(2)}) {
        sweeps.push_back({policy, first, moments});
      }
    }
  }
  return sweeps;
}
INSTANTIATE_TEST_SUITE_P(StepFault, Bf16MasterCopySweep,
                         ::testing::ValuesIn(bf16_master_copy_sweeps()), sweep_name);

// The same weights with the device lost at each call, under every placement, at the first step
// and at the second.
TEST_P(Bf16MasterDeviceLostSweep, DeviceLostAtEachCallEndsInOneOfTheTwoStates) {
  const auto [policy, first, moments] = GetParam();
  const std::uint64_t calls = events_in_a_phase(
      faults, policy, [](const tide_standin_stats& s) { return s.driver_calls; }, moments,
      Dtype::kBFloat16, first);
  ASSERT_GT(calls, 0u);
  for (std::uint64_t n = 1; n <= calls + 1; ++n) {
    step_with_fault(
        faults, policy, [&] { faults.device_lost(n); },
        "bf16 master, step " + std::to_string(first) + ", device lost at call " + std::to_string(n),
        moments, Dtype::kBFloat16, first);
  }
}

std::vector<Sweep> every_policy_at_steps(std::initializer_list<int> firsts) {
  std::vector<Sweep> sweeps;
  for (const int first : firsts) {
    for (const Policy& policy : kPolicies) sweeps.push_back({policy, first, Dtype::kFloat32});
  }
  return sweeps;
}
INSTANTIATE_TEST_SUITE_P(StepFault, Bf16MasterDeviceLostSweep,
                         ::testing::ValuesIn(every_policy_at_steps({1, 2})), sweep_name);

// The second step's GPU subgroups copy 2 bytes per parameter less over the link than the first:
// their bf16 weights come from the model's parameters, on the device.
TEST_F(StepFaultTest, Bf16MasterWeightsComeFromTheModelOnTheDevice) {
  const auto h2d = [](const tide_standin_stats& s) { return s.bytes_h2d; };
  const Policy gpu = Policy::all_gpu();
  const std::uint64_t first =
      events_in_a_phase(faults, gpu, h2d, Dtype::kFloat32, Dtype::kBFloat16, 1);
  const std::uint64_t second =
      events_in_a_phase(faults, gpu, h2d, Dtype::kFloat32, Dtype::kBFloat16, 2);
  std::uint64_t params = 0;
  for (std::uint64_t n : kSizes) params += n;
  EXPECT_EQ(first - second, 2 * params);
}

TEST_F(StepFaultTest, EveryDeviceAllocationOfAPhaseFailingInTurnStillCompletesTheStep) {
  for (const Policy& policy : kPolicies) {
    const std::uint64_t allocations = events_in_a_phase(
        faults, policy,
        [](const tide_standin_stats& s) { return s.device_allocs + s.mem_creates; });
    for (std::uint64_t n = 1; n <= allocations + 1; ++n) {
      step_with_fault(
          faults, policy, [&] { faults.fail_alloc(n); }, "allocation " + std::to_string(n));
    }
  }
}

TEST_P(DeviceLostSweep, DeviceLostAtEachCallOfAPhaseEndsInOneOfTheTwoStates) {
  const Policy policy = GetParam().policy;
  const std::uint64_t calls =
      events_in_a_phase(faults, policy, [](const tide_standin_stats& s) { return s.driver_calls; });
  ASSERT_GT(calls, 0u);
  for (std::uint64_t n = 1; n <= calls + 1; ++n) {
    step_with_fault(
        faults, policy, [&] { faults.device_lost(n); }, "device lost at call " + std::to_string(n));
  }
}
INSTANTIATE_TEST_SUITE_P(StepFault, DeviceLostSweep,
                         ::testing::ValuesIn(every_policy_at_steps({1})), sweep_name);

// A completed step after a fault says what it did.
TEST_F(StepFaultTest, AFailedGpuCopyIsRolledForwardOnTheCpu) {
  const driver::CurrentContext context;
  HostModel model(kSizes);
  Reference ref = reference_of(model);
  Executor executor(*model.state, options_for_test());
  auto grads = model.make_gradients(1);
  model.offload_all(executor);
  executor.ready(hyper(1));
  faults.fail_copy(1);  // the first subgroup's copy-in
  const PhaseReport& r = executor.run(hyper(1), Policy::all_gpu(), kHeadroom);
  EXPECT_GE(r.rolled_forward, 1u);
  EXPECT_NE(r.fault.find("LAUNCH_FAILED"), std::string::npos) << r.fault;
  EXPECT_EQ(r.ran.gpu_order.size() + r.rolled_forward, kSizes.size());
  EXPECT_TRUE(r.unwritten.empty());
  ref.step(grads, hyper(1));
  EXPECT_TRUE(Snapshot::of(model) == Snapshot::of(ref));
}

// The commit point's spares are a small pool: as many as GPU subgroups were in flight, per
// subgroup size, not a second copy of the state; the state itself moves between them.
void spares_are_few(Dtype state_dtype) {
  SCOPED_TRACE(state_dtype == Dtype::kFloat32 ? "fp32 moments" : "bf16 moments");
  const driver::CurrentContext context;
  HostModel model(std::vector<std::uint64_t>(8, 4096), state_dtype);
  Reference ref = reference_of(model);
  ExecutorOptions options = options_for_test();
  options.planner.max_buffers = 2;
  Executor executor(*model.state, options);
  const float* first = model.state->param(0);
  for (int step = 1; step <= 3; ++step) {
    auto grads = model.make_gradients(step);
    model.offload_all(executor);
    const PhaseReport& r = executor.run(hyper(step), Policy::all_gpu(), kHeadroom);
    ASSERT_EQ(r.ran.gpu_order.size(), 8u);
    ASSERT_EQ(r.ran.buffers, 2u);
    EXPECT_LE(model.state->spares(), 2u);
    ref.step(grads, hyper(step));
    EXPECT_TRUE(Snapshot::of(model) == Snapshot::of(ref));
    if (step == 1) {
      EXPECT_NE(model.state->param(0), first);  // committed into what was a spare
    }
  }
}

TEST_F(StepFaultTest, SpareSlotsAreAsManyAsBuffersNotASecondState) {
  for (const Dtype state_dtype : {Dtype::kFloat32, Dtype::kBFloat16}) {
    spares_are_few(state_dtype);
  }
}

// Frozen slices (parameters without a gradient) keep their state and weights, bit for bit.
void frozen_slices_are_kept(Dtype state_dtype) {
  for (const Policy& policy : kPolicies) {
    SCOPED_TRACE(policy_name(policy) +
                 (state_dtype == Dtype::kFloat32 ? ", fp32 moments" : ", bf16 moments"));
    const driver::CurrentContext context;
    HostModel model(kSizes, state_dtype);
    Reference ref = reference_of(model);
    Executor executor(*model.state, options_for_test());
    const Snapshot before = Snapshot::of(model);
    executor.set_frozen(0, 1, true);  // the middle third of subgroup 0
    executor.set_frozen(3, 0, true);  // the whole of subgroup 3
    auto grads = model.make_gradients(1);
    model.offload_all(executor);
    executor.run(hyper(1), policy, kHeadroom);
    ref.step(grads, hyper(1));
    const Snapshot now = Snapshot::of(model);
    const Snapshot stepped = Snapshot::of(ref);
    const ParamSlice& frozen = model.state->spec(0).slices[1];
    for (std::uint64_t e = 0; e < kSizes[0]; ++e) {
      const bool is_frozen = e >= frozen.offset && e < frozen.offset + frozen.count;
      const Snapshot& expect = is_frozen ? before : stepped;
      // Element e's bytes of the master weights and of each moment.
      const std::uint64_t n = kSizes[0], mb = model.state->moment_bytes();
      for (const auto& [at, size] :
           {std::pair{4 * e, std::uint64_t{4}}, std::pair{4 * n + mb * e, mb},
            std::pair{4 * n + mb * n + mb * e, mb}}) {
        ASSERT_EQ(0, std::memcmp(now.state[0].data() + at, expect.state[0].data() + at, size)) << e;
      }
      ASSERT_EQ(now.params[0][e], expect.params[0][e]) << e;
    }
    EXPECT_EQ(now.state[3], before.state[3]);
    EXPECT_EQ(now.params[3], before.params[3]);
    EXPECT_EQ(now.state[1], stepped.state[1]);
    EXPECT_EQ(now.params[2], stepped.params[2]);
  }
}

TEST_F(StepFaultTest, FrozenSlicesAreLeftExactlyAsTheyWere) {
  for (const Dtype state_dtype : {Dtype::kFloat32, Dtype::kBFloat16}) {
    frozen_slices_are_kept(state_dtype);
  }
}

}  // namespace
}  // namespace tide::runtime::testing
