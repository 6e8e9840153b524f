// The same updates whichever side runs a subgroup: all-CPU, all-GPU, interleaved and planned
// placements give the reference's bits (the stand-in's GPU kernel is the host twin of the real
// kernel, and both compute kernels/adam_math.h exactly), over several steps, with subgroups of
// odd sizes and subgroups split over several parameter tensors.
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <limits>
#include <string>

#include "planner/calibration_file.h"
#include "runtime/gradient_stats.h"
#include "tests/runtime/executor_fixture.h"

namespace tide::runtime::testing {
namespace {

constexpr std::uint64_t kHeadroom = std::uint64_t{1} << 30;

void run_steps(const Policy& policy, bool gradients_on_gpu, bool prepare,
               Dtype state_dtype = Dtype::kFloat32,
               kernels::StateFormat format = kernels::StateFormat::kDtype,
               std::uint64_t chunk = kDefaultGpuChunkParams) {
  const driver::CurrentContext context;
  Model model({3000, 4096, 777, 10000, 1, 2048, 5000}, /*split_every=*/2, 3, true, state_dtype,
              format);
  Reference ref(*model.state);
  ExecutorOptions options;
  options.rates = test_rates();
  options.gradients_on_gpu = gradients_on_gpu ? KeptGradients::yes : KeptGradients::no;
  options.refine = false;  // the stand-in's measured times must not change the placement here
  options.gpu_chunk_params = chunk;
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
      EXPECT_EQ(report.gpu_seconds + report.h2d_seconds + report.d2h_seconds, 0.0);
    } else {
      // Each stream's busy time: its kernels or copies, one after another inside the phase.
      for (double busy : {report.gpu_seconds, report.h2d_seconds, report.d2h_seconds}) {
        EXPECT_GT(busy, 0.0);
        EXPECT_LE(busy, report.seconds);
      }
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

// GPU subgroups in chunks (ExecutorOptions::gpu_chunk_params): each chunk's copies and update
// cover its own elements of every array of the slot, the gradient and the weights, whatever the
// format; a last chunk may be partial, and a subgroup may be smaller than one chunk.
constexpr std::uint64_t kSmallChunk = 512;
TEST(ExecutorNumerics, AllGpuInChunks) {
  run_steps(Policy::all_gpu(), false, false, Dtype::kFloat32, kernels::StateFormat::kDtype,
            kSmallChunk);
}
TEST(ExecutorNumerics, InterleavedK2InChunks) {
  run_steps(Policy::every(2), false, false, Dtype::kFloat32, kernels::StateFormat::kDtype,
            kSmallChunk);
}
TEST(ExecutorNumerics, AllGpuWithGradientsKeptOnGpuInChunks) {
  run_steps(Policy::all_gpu(), true, true, Dtype::kFloat32, kernels::StateFormat::kDtype,
            kSmallChunk);
}
TEST(ExecutorNumerics, Bf16MomentsAllGpuInChunks) {
  run_steps(Policy::all_gpu(), false, false, Dtype::kBFloat16, kernels::StateFormat::kDtype,
            kSmallChunk);
}
TEST(ExecutorNumerics, Q8MomentsAllGpuInChunksOfOneBlock) {
  run_steps(Policy::all_gpu(), false, false, Dtype::kFloat32, kernels::StateFormat::kBlockQ8,
            kernels::kQuantBlock);
}
TEST(ExecutorNumerics, Q8MomentsPlannedWithGradientsKeptOnGpuInChunks) {
  run_steps(Policy::automatic_policy(), true, true, Dtype::kFloat32, kernels::StateFormat::kBlockQ8,
            kSmallChunk);
}
TEST(ExecutorNumerics, ChunksMustBeWholeQuantizationBlocks) {
  const driver::CurrentContext context;
  Model model({3000});
  for (std::uint64_t chunk : {std::uint64_t{0}, std::uint64_t{100}, kernels::kQuantBlock + 1}) {
    ExecutorOptions options;
    options.rates = test_rates();
    options.gpu_chunk_params = chunk;
    EXPECT_THROW(Executor(*model.state, options), std::invalid_argument) << chunk;
  }
}

// bf16 moments (8 state bytes per parameter in the slots, the GPU buffers and both copies): the
// GPU subgroups (the kernel's own source on the stand-in) and the CPU path give the bits of the
// CPU kernel run directly, rounding the moments to nearest even at every step alike.
TEST(ExecutorNumerics, Bf16MomentsAllCpu) {
  run_steps(Policy::all_cpu(), false, false, Dtype::kBFloat16);
}
TEST(ExecutorNumerics, Bf16MomentsAllGpu) {
  run_steps(Policy::all_gpu(), false, false, Dtype::kBFloat16);
}
TEST(ExecutorNumerics, Bf16MomentsInterleavedK2) {
  run_steps(Policy::every(2), false, false, Dtype::kBFloat16);
}
TEST(ExecutorNumerics, Bf16MomentsPlannedWithGradientsKeptOnGpu) {
  run_steps(Policy::automatic_policy(), true, true, Dtype::kBFloat16);
}

// The state slot is 8 bytes per parameter with bf16 moments, and the plan's GPU buffers and
// copies are sized by it.
TEST(ExecutorNumerics, Bf16MomentsHalveTheMomentsBytes) {
  const driver::CurrentContext context;
  Model fp32({4096, 4096}, 0, 3, false);
  Model bf16({4096, 4096}, 0, 3, false, Dtype::kBFloat16);
  EXPECT_EQ(fp32.state->state_bytes(), 12u);
  EXPECT_EQ(bf16.state->state_bytes(), 8u);
  EXPECT_EQ(bf16.state->slot_bytes(1), 8u * 4096);
  EXPECT_EQ(
      static_cast<char*>(bf16.state->exp_avg(0)) - reinterpret_cast<char*>(bf16.state->param(0)),
      4 * 4096);
  EXPECT_EQ(
      static_cast<char*>(bf16.state->exp_avg_sq(0)) - reinterpret_cast<char*>(bf16.state->param(0)),
      6 * 4096);
  ExecutorOptions options;
  options.rates = test_rates();
  Executor a(*fp32.state, options);
  Executor b(*bf16.state, options);
  EXPECT_EQ(a.footprint(false).state_bytes_per_param, 12u);
  EXPECT_EQ(b.footprint(false).state_bytes_per_param, 8u);
  const planner::Plan pa = a.plan_for(Policy::all_gpu(), kHeadroom);
  const planner::Plan pb = b.plan_for(Policy::all_gpu(), kHeadroom);
  // The state, the gradient copied in and the staged bf16 weights.
  EXPECT_EQ(pa.buffer_bytes, 4096u * (12 + 2 + 2));
  EXPECT_EQ(pb.buffer_bytes, 4096u * (8 + 2 + 2));
  EXPECT_LT(pb.predicted.phase_s, pa.predicted.phase_s);
}

// 8-bit moments (codes at 256-byte boundaries of the slot, then the block scales; subgroups of
// sizes that are not multiples of 256, so partial last blocks): GPU subgroups (tide_adam_step_q8's
// own source on the stand-in) and the CPU path give the bits of the CPU kernel run directly.
constexpr auto kQ8 = kernels::StateFormat::kBlockQ8;
TEST(ExecutorNumerics, Q8MomentsAllCpu) {
  run_steps(Policy::all_cpu(), false, false, Dtype::kFloat32, kQ8);
}
TEST(ExecutorNumerics, Q8MomentsAllGpu) {
  run_steps(Policy::all_gpu(), false, false, Dtype::kFloat32, kQ8);
}
TEST(ExecutorNumerics, Q8MomentsInterleavedK2) {
  run_steps(Policy::every(2), false, false, Dtype::kFloat32, kQ8);
}
TEST(ExecutorNumerics, Q8MomentsPlannedWithGradientsKeptOnGpu) {
  run_steps(Policy::automatic_policy(), true, true, Dtype::kFloat32, kQ8);
}

// The 8-bit slot: fp32 weights, each moment's codes at a 256-byte boundary, the scales; the
// footprint plans 6 state bytes per parameter.
TEST(ExecutorNumerics, Q8MomentsSlotLayout) {
  const driver::CurrentContext context;
  Model q8({4096, 1000}, 0, 3, false, Dtype::kFloat32, kQ8);
  const OptimizerState& s = *q8.state;
  EXPECT_EQ(s.state_bytes(), 6u);
  auto offset = [&](const void* p, std::size_t i) {
    return static_cast<const char*>(p) - reinterpret_cast<const char*>(s.param(i));
  };
  EXPECT_EQ(offset(s.exp_avg(0), 0), 4 * 4096);
  EXPECT_EQ(offset(s.exp_avg_sq(0), 0), 5 * 4096);
  EXPECT_EQ(offset(s.exp_avg_scale(0), 0), 6 * 4096);
  EXPECT_EQ(s.slot_bytes(0), 6u * 4096 + 2 * 4 * 16);
  // 1000: 4000 bytes of weights padded to 4096, 1000 codes padded to 1024, 4 blocks.
  EXPECT_EQ(offset(s.exp_avg(1), 1), 4096);
  EXPECT_EQ(offset(s.exp_avg_sq(1), 1), 4096 + 1024);
  EXPECT_EQ(offset(s.exp_avg_sq_scale(1), 1), 4096 + 2048 + 16);
  EXPECT_EQ(s.slot_bytes(1), 4096u + 2048 + 32);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(s.exp_avg(i)) % 256, 0u);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(s.exp_avg_sq(i)) % 256, 0u);
  }
  ExecutorOptions options;
  options.rates = test_rates();
  Executor x(*q8.state, options);
  EXPECT_EQ(x.footprint(false).state_bytes_per_param, 6u);
  // The planner counts the slot as it is: a buffer of a GPU subgroup holds its scales and
  // padding too (and the gradient copied in, and the staged bf16 weights), and the copies move 6
  // bytes and the scales' 8 per 256 parameters.
  for (const planner::Footprint f : {x.footprint(false), x.footprint(true)}) {
    for (std::uint64_t n : {1ull, 1000ull, 4096ull, 100'000'003ull}) {
      EXPECT_EQ(f.buffer_bytes(n), s.slot_bytes_for(n) + (f.gradients_on_gpu ? 0 : 2 * n) + 2 * n)
          << n;
    }
    EXPECT_DOUBLE_EQ(static_cast<double>(f.d2h_bytes_per_param()), 6.0 + 8.0 / 256);
  }
  // The 8-bit CPU update is compute-bound: the model starts below fp32 state's CPU rate (not
  // at the 28/16 its bytes would give); the GPU update is scaled by its bytes.
  const planner::Rates r = test_rates();
  const planner::PerformanceModel model(r, x.footprint(false));
  EXPECT_LT(model.rates().cpu_update, 0.5 * r.cpu_update);
  EXPECT_LT(model.rates().cpu_update_contended, 0.5 * r.cpu_update_contended);
  EXPECT_DOUBLE_EQ(model.rates().gpu_update, r.gpu_update * 28.0 / 16.0);
}

// The executor plans with the CPU update factor calibration measured for its state format: given
// with its options, or the calibration file's when it reads its rates from there too; rates given
// without factors keep the model's (8-bit moments: kQ8CpuUpdateFactor).
TEST(ExecutorNumerics, Q8MomentsPlanWithTheCalibratedCpuFactor) {
  const driver::CurrentContext context;
  Model q8({4096, 1000}, 0, 3, false, Dtype::kFloat32, kQ8);
  planner::CpuUpdateFactors factors;
  factors[planner::UpdateFormat::q8_moments] = 0.9;
  factors[planner::UpdateFormat::bf16_moments] = 1.1;
  ExecutorOptions options;
  options.rates = test_rates();
  planner::Plan model_plan;
  {
    Executor x(*q8.state, options);
    EXPECT_FALSE(x.footprint(false).cpu_update_calibrated());
    EXPECT_DOUBLE_EQ(x.footprint(false).cpu_update_scale(), planner::Footprint::kQ8CpuUpdateFactor);
    model_plan = x.plan_for(Policy::all_cpu(), kHeadroom);
  }
  {
    options.cpu_update_factors = factors;
    Executor x(*q8.state, options);
    EXPECT_DOUBLE_EQ(x.footprint(true).cpu_update_scale(), 0.9);
    EXPECT_DOUBLE_EQ(
        x.plan_for(Policy::all_cpu(), kHeadroom).predicted.cpu_side_s,
        model_plan.predicted.cpu_side_s * planner::Footprint::kQ8CpuUpdateFactor / 0.9);
  }
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("tide_executor_calibration_" + std::to_string(::getpid()) + ".json");
  planner::Calibration c;
  c.machine.hostname = "h";
  c.machine.cpu_threads = 1;
  c.machine.ranks_per_host = 1;
  c.rates = test_rates();
  c.cpu_update_factors = factors;
  save_calibration(path, c);
  setenv("TIDE_CALIBRATION_FILE", path.c_str(), 1);
  {
    Executor x(*q8.state, ExecutorOptions{});
    EXPECT_DOUBLE_EQ(x.footprint(false).cpu_update_scale(), 0.9);
  }
  unsetenv("TIDE_CALIBRATION_FILE");
  std::filesystem::remove(path);
}

TEST(ExecutorNumerics, StateDtypeMustBeFp32OrBf16) {
  const driver::CurrentContext context;
  std::vector<SubgroupSpec> specs(1);
  specs[0].params = 4;
  driver::DeviceBuffer params(8);
  specs[0].slices.push_back(ParamSlice{0, 4, params.get()});
  StateOptions options;
  options.state_dtype = Dtype::kFloat16;
  EXPECT_THROW(OptimizerState(specs, options), std::invalid_argument);
}

TEST(ExecutorNumerics, PlannerUsesTheGpuWithTheseRates) {
  const driver::CurrentContext context;
  Model model(std::vector<std::uint64_t>(8, 4096));
  ExecutorOptions options;
  options.rates = test_rates();
  Executor executor(*model.state, options);
  const planner::Plan plan = executor.plan_for(Policy::automatic_policy(), kHeadroom);
  EXPECT_GT(plan.gpu_order.size(), 0u);
  EXPECT_GT(plan.cpu_order.size(), 0u);
  EXPECT_TRUE(executor.plan_for(Policy::automatic_policy(), 0).gpu_order.empty());
}

// Non-finite gradients: counted per phase, never written, the same on both sides.
TEST(ExecutorNumerics, NonFiniteGradientsAreReportedAndNeverWritten) {
  for (const Policy& policy : {Policy::all_cpu(), Policy::all_gpu()}) {
    const driver::CurrentContext context;
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
  const driver::CurrentContext context;
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
}  // namespace tide::runtime::testing

namespace tide::runtime::testing {
namespace {

// Frozen slices with 8-bit moments (runtime/frozen_blocks.h): their master weights bit for bit;
// their moments' codes and scales exactly where they fill whole blocks (a frozen subgroup, the
// blocks inside a frozen slice); in a block shared with updated elements, each frozen element's
// old value requantized under the block's new scale. The updated elements outside shared blocks
// have the reference's bits.
TEST(ExecutorNumerics, Q8MomentsFrozenSlicesKeepTheirState) {
  for (const Policy& policy : {Policy::all_cpu(), Policy::all_gpu(), Policy::every(2)}) {
    SCOPED_TRACE(policy_name(policy));
    const driver::CurrentContext context;
    // Subgroup 0 in three slices: [0, 1000), [1000, 2000), [2000, 3000); subgroup 1 one slice.
    Model model({3000, 4096}, /*split_every=*/2, 3, true, Dtype::kFloat32, kQ8);
    const OptimizerState& s = *model.state;
    Reference ref(s);
    std::vector<std::vector<char>> before;
    for (std::size_t i = 0; i < 2; ++i) {
      const auto* p = reinterpret_cast<const char*>(s.param(i));
      before.emplace_back(p, p + s.slot_bytes(i));
    }
    std::vector<std::uint8_t> old_m(static_cast<const std::uint8_t*>(s.exp_avg(0)),
                                    static_cast<const std::uint8_t*>(s.exp_avg(0)) + 3000);
    std::vector<std::uint8_t> old_v(static_cast<const std::uint8_t*>(s.exp_avg_sq(0)),
                                    static_cast<const std::uint8_t*>(s.exp_avg_sq(0)) + 3000);
    std::vector<float> old_p(s.param(0), s.param(0) + 3000);
    std::vector<float> old_sm(s.exp_avg_scale(0), s.exp_avg_scale(0) + 12);
    std::vector<float> old_sv(s.exp_avg_sq_scale(0), s.exp_avg_sq_scale(0) + 12);
    ExecutorOptions options;
    options.rates = test_rates();
    options.refine = false;
    Executor executor(*model.state, options);
    executor.set_frozen(0, 1, true);
    executor.set_frozen(1, 0, true);
    auto grads = model.make_gradients(1);
    model.offload_all(executor);
    executor.run(hyper(1), policy, kHeadroom);
    ref.step(grads, hyper(1));

    const auto* now1 = reinterpret_cast<const char*>(s.param(1));
    EXPECT_EQ(std::vector<char>(now1, now1 + s.slot_bytes(1)), before[1]);
    const auto* cm = static_cast<const std::uint8_t*>(s.exp_avg(0));
    const auto* cv = static_cast<const std::uint8_t*>(s.exp_avg_sq(0));
    const auto* rm = reinterpret_cast<const std::uint8_t*>(ref.m[0].data() + ref.skip_m[0]);
    const auto* rv = reinterpret_cast<const std::uint8_t*>(ref.v[0].data() + ref.skip_v[0]);
    for (std::uint64_t e = 0; e < 3000; ++e) {
      const bool frozen = e >= 1000 && e < 2000;
      const std::uint64_t b = e / 256;
      const bool shared = b == 1000 / 256 || b == 1999 / 256;
      ASSERT_EQ(s.param(0)[e], frozen ? old_p[e] : ref.p[0][e]) << e;
      if (frozen && !shared) {
        ASSERT_EQ(cm[e], old_m[e]) << e;
        ASSERT_EQ(cv[e], old_v[e]) << e;
        ASSERT_EQ(s.exp_avg_scale(0)[b], old_sm[b]) << e;
        ASSERT_EQ(s.exp_avg_sq_scale(0)[b], old_sv[b]) << e;
      } else if (frozen) {
        using kernels::HostMath;
        const auto nm = kernels::q8_normalizer<HostMath>(s.exp_avg_scale(0)[b]);
        const auto nv = kernels::q8_normalizer<HostMath>(s.exp_avg_sq_scale(0)[b]);
        ASSERT_EQ(cm[e], kernels::q8_exp_avg_code<HostMath>(
                             kernels::q8_exp_avg_value<HostMath>(old_m[e], old_sm[b]), nm))
            << e;
        ASSERT_EQ(cv[e], kernels::q8_exp_avg_sq_code<HostMath>(
                             kernels::q8_exp_avg_sq_value<HostMath>(old_v[e], old_sv[b]), nv))
            << e;
      } else if (!shared) {
        ASSERT_EQ(cm[e], rm[e]) << e;
        ASSERT_EQ(cv[e], rv[e]) << e;
      }
    }
  }
}

}  // namespace
}  // namespace tide::runtime::testing
