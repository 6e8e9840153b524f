// The executor's C ABI, driven the way the Python optimizer drives it, and its bad inputs
// (TIDE_PLACEMENT included): every rejection names what is wrong.
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

#include "capi/status.h"
#include "config/env.h"
#include "tests/capi_step.h"
#include "tests/runtime/executor_fixture.h"
#include "tide/tide.h"

namespace tide::runtime::testing {
namespace {

// `state_dtype`: the moments' (TIDE_FLOAT32, TIDE_BFLOAT16, or TIDE_STATE_BLOCK_Q8: 8-bit codes,
// whose scales come from tide_optimizer_q8_scales).
void step_through_the_c_abi(std::int32_t state_dtype) {
  const driver::CurrentContext context;
  const std::vector<std::uint64_t> sizes = {3000, 5000, 4096, 100};
  const bool q8 = state_dtype == TIDE_STATE_BLOCK_Q8;
  // For its device buffers, gradients and initial values.
  Model model(sizes, 0, 3, true, q8 ? Dtype::kFloat32 : static_cast<Dtype>(state_dtype),
              q8 ? kernels::StateFormat::kBlockQ8 : kernels::StateFormat::kDtype);
  Reference ref(*model.state);
  const std::uint64_t mb = model.state->moment_bytes();

  tide_optimizer_options options;
  options = tide_optimizer_options_default();
  EXPECT_EQ(options.state_dtype, TIDE_FLOAT32);
  options.state_dtype = state_dtype;
  options.use_rates = 1;
  const planner::Rates r = test_rates();
  options.rates = tide_rates{r.cpu_update, r.cpu_update_contended, r.h2d,       r.d2h,
                             r.h2d_duplex, r.d2h_duplex,           r.gpu_update};
  std::vector<tide_param_slice> slices;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    slices.push_back({i, 0, sizes[i], model.params[i].get()});
  }
  tide_optimizer* opt = nullptr;
  ASSERT_EQ(tide_optimizer_create(sizes.data(), sizes.size(), slices.data(), slices.size(),
                                  &options, nullptr, &opt),
            TIDE_OK)
      << tide::capi::last_error_text();
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    tide_subgroup_buffers b;
    ASSERT_EQ(tide_optimizer_buffers(opt, i, &b), TIDE_OK);
    ASSERT_EQ(b.count, sizes[i]);
    std::memcpy(b.param, model.state->param(i), sizes[i] * 4);
    std::memcpy(b.exp_avg, model.state->exp_avg(i), sizes[i] * mb);
    std::memcpy(b.exp_avg_sq, model.state->exp_avg_sq(i), sizes[i] * mb);
    float* sm = nullptr;
    float* sv = nullptr;
    std::uint64_t blocks = 1;
    ASSERT_EQ(tide_optimizer_q8_scales(opt, i, &sm, &sv, &blocks), TIDE_OK);
    ASSERT_EQ(blocks, q8 ? kernels::quant_blocks(sizes[i]) : 0u);
    ASSERT_EQ(sm == nullptr, !q8);
    if (q8) {
      std::memcpy(sm, model.state->exp_avg_scale(i), blocks * 4);
      std::memcpy(sv, model.state->exp_avg_sq_scale(i), blocks * 4);
    }
  }
  auto grads = model.make_gradients(1);
  void* side = nullptr;
  ASSERT_EQ(tide_optimizer_offload_stream(opt, &side), TIDE_OK);
  EXPECT_NE(side, nullptr);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_EQ(tide_optimizer_offload_gradient(opt, i, 0, model.grads[i].get(), sizes[i],
                                              TIDE_BFLOAT16, nullptr),
              TIDE_OK)
        << tide::capi::last_error_text();
  }
  double sum_squares = 0;
  std::uint64_t nonfinite = 1;
  ASSERT_EQ(tide_optimizer_grad_stats(opt, &sum_squares, &nonfinite), TIDE_OK);
  EXPECT_EQ(nonfinite, 0u);
  EXPECT_GT(sum_squares, 0);

  const kernels::AdamHyper h = hyper(1);
  const tide_adam_hyper ch{h.lr,         h.beta1, h.beta2, h.eps, h.weight_decay,
                           h.grad_scale, h.step,  1,       0};
  const tide_placement_policy policy{TIDE_PLACEMENT_INTERLEAVE, 2};
  tide_step_result report = tide_step_result_default();
  ASSERT_EQ(tide::test::step_once(opt, &ch, &policy, 1 << 30, &report), TIDE_OK)
      << tide::capi::last_error_text();
  EXPECT_EQ(report.gpu_subgroups, 2u);
  EXPECT_EQ(report.cpu_subgroups, 2u);
  EXPECT_GT(report.seconds, 0);
  EXPECT_GT(report.predicted_seconds, 0);

  ref.step(grads, h);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    tide_subgroup_buffers b;
    ASSERT_EQ(tide_optimizer_buffers(opt, i, &b), TIDE_OK);
    EXPECT_EQ(0, std::memcmp(b.param, ref.p[i].data(), sizes[i] * 4));
    EXPECT_EQ(0, std::memcmp(b.exp_avg, ref.m[i].data() + ref.skip_m[i], sizes[i] * mb));
    EXPECT_EQ(0, std::memcmp(b.exp_avg_sq, ref.v[i].data() + ref.skip_v[i], sizes[i] * mb));
    if (q8) {
      float* sm = nullptr;
      float* sv = nullptr;
      std::uint64_t blocks = 0;
      ASSERT_EQ(tide_optimizer_q8_scales(opt, i, &sm, &sv, &blocks), TIDE_OK);
      EXPECT_EQ(0, std::memcmp(sm, ref.sm[i].data(), blocks * 4));
      EXPECT_EQ(0, std::memcmp(sv, ref.sv[i].data(), blocks * 4));
    }
    EXPECT_EQ(model.device_params(i), ref.copy[i]);
  }
  std::vector<uint8_t> device(sizes.size());
  std::vector<uint32_t> order(sizes.size());
  tide_plan_summary summary = tide_plan_summary_default();
  ASSERT_EQ(tide_optimizer_last_plan(opt, device.data(), order.data(), &summary), TIDE_OK);
  EXPECT_EQ(device, (std::vector<uint8_t>{1, 0, 1, 0}));
  std::vector<tide_subgroup_timing> timings(sizes.size());
  ASSERT_EQ(tide_optimizer_last_timings(opt, timings.data(), timings.size()), TIDE_OK);
  EXPECT_GT(timings[0].h2d, 0);
  EXPECT_GT(timings[1].cpu_update, 0);
  tide_rates rates;
  ASSERT_EQ(tide_optimizer_rates(opt, &rates), TIDE_OK);
  EXPECT_GT(rates.cpu_update, 0);
  // All of it pinned (no node limit here): nothing pageable (executor_pageable_test has some).
  std::size_t pageable = 1;
  std::uint64_t pageable_bytes = 1;
  ASSERT_EQ(tide_optimizer_pageable(opt, &pageable, &pageable_bytes), TIDE_OK);
  EXPECT_EQ(pageable, 0u);
  EXPECT_EQ(pageable_bytes, 0u);
  EXPECT_EQ(tide_optimizer_pageable(opt, nullptr, nullptr), TIDE_OK);
  EXPECT_EQ(tide_optimizer_destroy(opt), TIDE_OK);
}

TEST(ExecutorCapi, AStepThroughTheCAbiMatchesTheReference) { step_through_the_c_abi(TIDE_FLOAT32); }
TEST(ExecutorCapi, AStepWithBf16MomentsThroughTheCAbiMatchesTheReference) {
  step_through_the_c_abi(TIDE_BFLOAT16);
}

TEST(ExecutorCapi, AStepWith8BitMomentsThroughTheCAbiMatchesTheReference) {
  step_through_the_c_abi(TIDE_STATE_BLOCK_Q8);
}

TEST(ExecutorCapi, RejectsBadArguments) {
  const driver::CurrentContext context;
  driver::DeviceBuffer params(4096);
  const std::uint64_t sizes[] = {1000};
  tide_optimizer* opt = nullptr;
  // A gap in the slices.
  tide_param_slice gap{0, 0, 500, params.get()};
  EXPECT_EQ(tide_optimizer_create(sizes, 1, &gap, 1, nullptr, nullptr, &opt),
            TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("cover"), std::string::npos)
      << tide::capi::last_error_text();
  tide_param_slice wrong{3, 0, 1000, params.get()};
  EXPECT_EQ(tide_optimizer_create(sizes, 1, &wrong, 1, nullptr, nullptr, &opt),
            TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("subgroup 3"), std::string::npos);
  tide_optimizer_options options;
  options = tide_optimizer_options_default();
  tide_param_slice whole{0, 0, 1000, params.get()};
  options.state_dtype = TIDE_FLOAT16;  // the moments are fp32 or bf16
  EXPECT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &options, nullptr, &opt),
            TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("state_dtype"), std::string::npos)
      << tide::capi::last_error_text();
  options.state_dtype = 7;
  EXPECT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &options, nullptr, &opt),
            TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("state_dtype"), std::string::npos)
      << tide::capi::last_error_text();
  options.state_dtype = TIDE_FLOAT32;
  // Where kept gradients go: TIDE_GRADIENTS_AUTO by default, one of the three values.
  EXPECT_EQ(options.gradients_on_gpu, TIDE_GRADIENTS_AUTO);
  for (const int bad : {-1, 3}) {
    options.gradients_on_gpu = bad;
    EXPECT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &options, nullptr, &opt),
              TIDE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(opt, nullptr);
    EXPECT_NE(std::string(tide::capi::last_error_text()).find("gradients_on_gpu"),
              std::string::npos)
        << tide::capi::last_error_text();
  }
  options.gradients_on_gpu = TIDE_GRADIENTS_AUTO;
  // bf16 master weights: only of bf16 parameters, not with 8-bit moments, and a known dtype.
  EXPECT_EQ(options.master_dtype, TIDE_FLOAT32);
  options.master_dtype = TIDE_FLOAT16;
  EXPECT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &options, nullptr, &opt),
            TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("master_dtype"), std::string::npos)
      << tide::capi::last_error_text();
  options.master_dtype = TIDE_BFLOAT16;
  options.param_dtype = TIDE_FLOAT32;
  EXPECT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &options, nullptr, &opt),
            TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text())
                .find("bf16 master weights are the model's parameters: they must be bfloat16"),
            std::string::npos)
      << tide::capi::last_error_text();
  options.param_dtype = TIDE_BFLOAT16;
  options.state_dtype = TIDE_STATE_BLOCK_Q8;
  EXPECT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &options, nullptr, &opt),
            TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text())
                .find("bf16 master weights with 8-bit moments are not supported"),
            std::string::npos)
      << tide::capi::last_error_text();
  options.state_dtype = TIDE_FLOAT32;
  // Accepted: no fp32 master, the bf16 weights and their compensation instead.
  ASSERT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &options, nullptr, &opt), TIDE_OK)
      << tide::capi::last_error_text();
  tide_subgroup_buffers master_buffers{};
  ASSERT_EQ(tide_optimizer_buffers(opt, 0, &master_buffers), TIDE_OK);
  EXPECT_EQ(master_buffers.param, nullptr);
  std::uint16_t* w = nullptr;
  std::uint16_t* c = nullptr;
  ASSERT_EQ(tide_optimizer_master_bf16(opt, 0, &w, &c), TIDE_OK);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(c, w + 1000);
  EXPECT_EQ(tide_optimizer_master_bf16(opt, 1, &w, &c), TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tide_optimizer_destroy(opt), TIDE_OK);
  opt = nullptr;
  options.master_dtype = TIDE_FLOAT32;
  options.grad_dtype = 9;
  EXPECT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &options, nullptr, &opt),
            TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("grad_dtype"), std::string::npos);

  ASSERT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, nullptr, nullptr, &opt), TIDE_OK)
      << tide::capi::last_error_text();
  tide_adam_hyper h{1e-3, 0.9, 0.999, 1e-8, 0, 1, 1, 1, 0};
  const tide_placement_policy bad_k{TIDE_PLACEMENT_INTERLEAVE, 0};
  EXPECT_EQ(tide::test::step_once(opt, &h, &bad_k, 0, nullptr), TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("k >= 1"), std::string::npos);
  const tide_placement_policy bad_kind{42, 0};
  EXPECT_EQ(tide::test::step_once(opt, &h, &bad_kind, 0, nullptr), TIDE_ERROR_INVALID_ARGUMENT);
  h.beta1 = 1.5;
  EXPECT_EQ(tide::test::step_once(opt, &h, nullptr, 0, nullptr), TIDE_ERROR_INVALID_ARGUMENT);
  h.beta1 = 0.9;
  EXPECT_EQ(tide_optimizer_offload_gradient(opt, 0, 0, params.get(), 10, TIDE_FLOAT16, nullptr),
            TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("dtype"), std::string::npos);
  tide_subgroup_buffers b;
  EXPECT_EQ(tide_optimizer_buffers(opt, 1, &b), TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tide::test::step_once(nullptr, &h, nullptr, 0, nullptr), TIDE_ERROR_INVALID_ARGUMENT);

  // TIDE_PLACEMENT: the default policy, strictly parsed.
  for (const char* bad : {"0", "fast", "-2", "k", "2x", "gpu "}) {
    ::setenv("TIDE_PLACEMENT", bad, 1);
    EXPECT_EQ(tide::test::step_once(opt, &h, nullptr, 0, nullptr), TIDE_ERROR_INVALID_ARGUMENT)
        << bad;
    const std::string message = tide::capi::last_error_text();
    EXPECT_NE(message.find("TIDE_PLACEMENT"), std::string::npos) << message;
    EXPECT_NE(message.find("auto, cpu, gpu"), std::string::npos) << message;
  }
  for (const char* good : {"auto", "cpu", "gpu", "3", "k2"}) {
    ::setenv("TIDE_PLACEMENT", good, 1);
    EXPECT_EQ(tide::test::step_once(opt, &h, nullptr, 1 << 20, nullptr), TIDE_OK)
        << good << ": " << tide::capi::last_error_text();
    ++h.step;
  }
  ::unsetenv("TIDE_PLACEMENT");
  EXPECT_EQ(tide_optimizer_destroy(opt), TIDE_OK);
}

// A caller that passes its own rates may give the host memory rates beside them (0: the built-in
// ones, as before they existed); the optimizer hands back the rates its next plan uses, and a bad
// one is refused naming the field, nothing created. tide_host_memory_rates_resolve reads the
// sources tide_rates_resolve does.
TEST(ExecutorCapi, HostMemoryRatesAreGivenWithTheRatesAndReadBack) {
  const driver::CurrentContext context;
  driver::DeviceBuffer params(2 * 1000);
  const std::uint64_t sizes[] = {1000};
  const tide_param_slice whole{0, 0, 1000, params.get()};
  tide_optimizer_options options = tide_optimizer_options_default();
  EXPECT_EQ(options.host_memory_rate, 0.0);
  EXPECT_EQ(options.host_memory_contended_rate, 0.0);
  options.use_rates = 1;
  options.refine = 0;
  options.rates = tide_rates{1e9, 0.5e9, 12e9, 12e9, 6e9, 6e9, 1e10};
  auto created_with = [&](double alone, double contended) {
    options.host_memory_rate = alone;
    options.host_memory_contended_rate = contended;
    tide_optimizer* opt = nullptr;
    EXPECT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &options, nullptr, &opt), TIDE_OK)
        << tide::capi::last_error_text();
    tide_host_memory_rates got = tide_host_memory_rates_default();
    EXPECT_EQ(tide_optimizer_host_memory_rates(opt, &got), TIDE_OK)
        << tide::capi::last_error_text();
    EXPECT_EQ(tide_optimizer_host_memory_rates(opt, nullptr), TIDE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(tide_optimizer_destroy(opt), TIDE_OK);
    return std::pair{got.host_memory, got.host_memory_contended};
  };
  EXPECT_EQ(created_with(0, 0),
            std::pair(planner::kBuiltinHostMemory, planner::kBuiltinHostMemoryContended));
  EXPECT_EQ(created_with(30e9, 20e9), std::pair(30e9, 20e9));
  EXPECT_EQ(created_with(0, 20e9), std::pair(planner::kBuiltinHostMemory, 20e9));

  for (const double bad : {-1.0, 1e3, 1e20, std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::infinity()}) {
    for (const bool contended : {false, true}) {
      options.host_memory_rate = contended ? 0 : bad;
      options.host_memory_contended_rate = contended ? bad : 0;
      tide_optimizer* opt = nullptr;
      EXPECT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &options, nullptr, &opt),
                TIDE_ERROR_INVALID_ARGUMENT)
          << bad;
      EXPECT_EQ(opt, nullptr);
      const std::string field = contended ? "host_memory_contended_rate" : "host_memory_rate must";
      EXPECT_NE(std::string(tide::capi::last_error_text()).find(field), std::string::npos)
          << tide::capi::last_error_text();
    }
  }

  ::unsetenv("TIDE_CALIBRATION_FILE");
  const char* cache_home = std::getenv("XDG_CACHE_HOME");
  const std::string saved_cache_home = cache_home != nullptr ? cache_home : "";
  tide_host_memory_rates resolved = tide_host_memory_rates_default();
  ASSERT_EQ(tide_host_memory_rates_resolve("/nonexistent-tide-test/none.json", &resolved),
            TIDE_ERROR_INVALID_ARGUMENT);
  ::setenv("XDG_CACHE_HOME", "/nonexistent-tide-test", 1);
  ASSERT_EQ(tide_host_memory_rates_resolve(nullptr, &resolved), TIDE_OK)
      << tide::capi::last_error_text();
  EXPECT_EQ(resolved.host_memory, planner::kBuiltinHostMemory);
  EXPECT_EQ(resolved.host_memory_contended, planner::kBuiltinHostMemoryContended);
  EXPECT_EQ(tide_host_memory_rates_resolve(nullptr, nullptr), TIDE_ERROR_INVALID_ARGUMENT);
  // A caller's older struct, with the first rate only: the second is not written.
  tide_host_memory_rates older = tide_host_memory_rates_default();
  older.struct_size = offsetof(tide_host_memory_rates, host_memory_contended);
  older.host_memory_contended = -7;
  ASSERT_EQ(tide_host_memory_rates_resolve(nullptr, &older), TIDE_OK);
  EXPECT_EQ(older.host_memory, planner::kBuiltinHostMemory);
  EXPECT_EQ(older.host_memory_contended, -7);
  if (cache_home != nullptr) {
    ::setenv("XDG_CACHE_HOME", saved_cache_home.c_str(), 1);
  } else {
    ::unsetenv("XDG_CACHE_HOME");
  }
}

// tide_optimizer_create_ex: a caller that passes its own rates passes the CPU update factors of
// the state formats with them (else the model's: 0.35 for 8-bit moments), each 0 or a plausible
// ratio; a bad one is refused naming the field, and nothing is created.
TEST(ExecutorCapi, CreateExTakesCpuUpdateFactorsAndRefusesBadOnes) {
  const driver::CurrentContext context;
  driver::DeviceBuffer params(2 * 1000);
  const std::uint64_t sizes[] = {1000};
  const tide_param_slice whole{0, 0, 1000, params.get()};
  tide_optimizer_options options;
  options = tide_optimizer_options_default();
  options.state_dtype = TIDE_STATE_BLOCK_Q8;
  options.use_rates = 1;
  options.refine = 0;
  options.rates = tide_rates{1e9, 0.5e9, 12e9, 12e9, 6e9, 6e9, 1e10};
  // The model's all-CPU prediction of a step: the parameters over the CPU update rate in the
  // format (the weights' upload, 2000 bytes at 12 GB/s, is shorter).
  auto all_cpu_seconds = [&](const tide_cpu_update_factors* factors) {
    tide_optimizer* opt = nullptr;
    EXPECT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &options, factors, &opt), TIDE_OK)
        << tide::capi::last_error_text();
    if (opt == nullptr) return 0.0;
    const tide_adam_hyper h{1e-3, 0.9, 0.999, 1e-8, 0, 1, 1, 1, 0};
    const tide_placement_policy cpu{TIDE_PLACEMENT_CPU, 0};
    tide_step_result report = tide_step_result_default();
    EXPECT_EQ(tide::test::step_once(opt, &h, &cpu, 0, &report), TIDE_OK)
        << tide::capi::last_error_text();
    EXPECT_EQ(tide_optimizer_destroy(opt), TIDE_OK);
    return report.all_cpu_seconds;
  };
  EXPECT_DOUBLE_EQ(all_cpu_seconds(nullptr), 1000 / (1e9 * planner::Footprint::kQ8CpuUpdateFactor));
  tide_cpu_update_factors factors = tide_cpu_update_factors_default();
  EXPECT_EQ(factors.struct_size, sizeof(tide_cpu_update_factors));
  EXPECT_EQ(factors.q8_moments, 0.0);
  EXPECT_EQ(factors.q8_moments_contended, 0.0);
  EXPECT_DOUBLE_EQ(all_cpu_seconds(&factors),
                   1000 / (1e9 * planner::Footprint::kQ8CpuUpdateFactor));
  factors.q8_moments = 0.5;
  factors.q8_moments_contended = 0.8;
  factors.bf16_moments = 3;  // another format's: not this optimizer's
  EXPECT_DOUBLE_EQ(all_cpu_seconds(&factors), 1000 / (1e9 * 0.5));

  auto refused = [&](const tide_cpu_update_factors& bad, const std::string& why) {
    tide_optimizer* opt = nullptr;
    EXPECT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &options, &bad, &opt),
              TIDE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(opt, nullptr);
    EXPECT_NE(std::string(tide::capi::last_error_text()).find(why), std::string::npos)
        << tide::capi::last_error_text();
  };
  tide_cpu_update_factors bad = factors;
  bad.q8_moments = 1000;
  refused(bad, "factors->q8_moments is 1000");
  bad = factors;
  bad.bf16_master_contended = -1;
  refused(bad, "factors->bf16_master_contended");
  bad = factors;
  bad.bf16_master_bf16_moments = std::numeric_limits<double>::quiet_NaN();
  refused(bad, "factors->bf16_master_bf16_moments");
  bad = factors;
  bad.bf16_moments = 0.005;
  refused(bad, "must be 0 (not measured: the model's) or a number from 0.01 to 100");
  bad = factors;
  bad.struct_size = sizeof(tide_cpu_update_factors) + 8;  // from a newer tide.h
  refused(bad, "struct_size");
  bad.struct_size = 0;
  refused(bad, "struct_size");
}

// tide_optimizer_set_state_rounding: stochastic rounding for bf16 moments only, a known mode;
// and it changes the step's bits (the executor hands the kernels the mode and the seed).
TEST(ExecutorCapi, StateRoundingIsForBf16MomentsAndChangesTheBits) {
  const driver::CurrentContext context;
  driver::DeviceBuffer params(4096);
  const std::uint64_t sizes[] = {1000};
  tide_param_slice whole{0, 0, 1000, params.get()};
  tide_optimizer_options options;
  options = tide_optimizer_options_default();
  for (const std::int32_t state : {std::int32_t{TIDE_FLOAT32}, std::int32_t{TIDE_STATE_BLOCK_Q8}}) {
    options.state_dtype = state;
    tide_optimizer* opt = nullptr;
    ASSERT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &options, nullptr, &opt), TIDE_OK);
    EXPECT_EQ(tide_optimizer_set_state_rounding(opt, TIDE_STATE_ROUNDING_STOCHASTIC, 1),
              TIDE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(tide::capi::last_error_text()).find("bf16 moments only"),
              std::string::npos)
        << tide::capi::last_error_text();
    EXPECT_EQ(tide_optimizer_set_state_rounding(opt, TIDE_STATE_ROUNDING_NEAREST, 1), TIDE_OK);
    EXPECT_EQ(tide_optimizer_destroy(opt), TIDE_OK);
  }
  options.state_dtype = TIDE_BFLOAT16;
  {
    // bf16 master weights round to nearest: their kernels have no stochastic variant.
    tide_optimizer_options master = options;
    master.master_dtype = TIDE_BFLOAT16;
    master.param_dtype = TIDE_BFLOAT16;
    tide_optimizer* opt = nullptr;
    ASSERT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &master, nullptr, &opt), TIDE_OK)
        << tide::capi::last_error_text();
    EXPECT_EQ(tide_optimizer_set_state_rounding(opt, TIDE_STATE_ROUNDING_STOCHASTIC, 1),
              TIDE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(tide::capi::last_error_text()).find("bf16 master"), std::string::npos)
        << tide::capi::last_error_text();
    EXPECT_EQ(tide_optimizer_set_state_rounding(opt, TIDE_STATE_ROUNDING_NEAREST, 1), TIDE_OK);
    EXPECT_EQ(tide_optimizer_destroy(opt), TIDE_OK);
  }
  std::vector<std::uint16_t> v[2];
  for (const std::int32_t rounding :
       {std::int32_t{TIDE_STATE_ROUNDING_NEAREST}, std::int32_t{TIDE_STATE_ROUNDING_STOCHASTIC}}) {
    tide_optimizer* opt = nullptr;
    ASSERT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &options, nullptr, &opt), TIDE_OK);
    EXPECT_EQ(tide_optimizer_set_state_rounding(opt, 7, 1), TIDE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(tide_optimizer_set_state_rounding(nullptr, rounding, 1), TIDE_ERROR_INVALID_ARGUMENT);
    ASSERT_EQ(tide_optimizer_set_state_rounding(opt, rounding, 1234), TIDE_OK);
    tide_subgroup_buffers b;
    ASSERT_EQ(tide_optimizer_buffers(opt, 0, &b), TIDE_OK);
    for (std::size_t i = 0; i < 1000; ++i) {
      static_cast<std::uint16_t*>(b.grad)[i] =
          kernels::float_to_bf16(0.5f + 1e-3f * static_cast<float>(i));
    }
    tide_adam_hyper h{1e-3, 0.9, 0.999, 1e-8, 0, 1, 1, 1, 0};
    const tide_placement_policy cpu{TIDE_PLACEMENT_CPU, 0};
    for (; h.step <= 20; ++h.step) {
      ASSERT_EQ(tide::test::step_once(opt, &h, &cpu, 0, nullptr), TIDE_OK)
          << tide::capi::last_error_text();
    }
    ASSERT_EQ(tide_optimizer_buffers(opt, 0, &b), TIDE_OK);
    const auto* sq = static_cast<const std::uint16_t*>(b.exp_avg_sq);
    v[rounding].assign(sq, sq + 1000);
    EXPECT_EQ(tide_optimizer_destroy(opt), TIDE_OK);
  }
  EXPECT_NE(v[0], v[1]);
}

// A step whose device is lost once it is ready: the state completes on the CPU, the status and
// the outcome say the parameters were not written, and tide_optimizer_write_params writes them
// once the device is back. Frozen slices are checked and left alone.
TEST(ExecutorCapi, AStepAfterReadyCompletesAndSaysWhatItCouldNotWrite) {
  const driver::CurrentContext context;
  const std::vector<std::uint64_t> sizes = {3000, 4096};
  Model model(sizes);
  Reference ref(*model.state);
  std::vector<tide_param_slice> slices;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    slices.push_back({i, 0, sizes[i], model.params[i].get()});
  }
  tide_optimizer* opt = nullptr;
  ASSERT_EQ(tide_optimizer_create(sizes.data(), sizes.size(), slices.data(), slices.size(), nullptr,
                                  nullptr, &opt),
            TIDE_OK)
      << tide::capi::last_error_text();
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    tide_subgroup_buffers b;
    ASSERT_EQ(tide_optimizer_buffers(opt, i, &b), TIDE_OK);
    std::memcpy(b.param, model.state->param(i), sizes[i] * 4);
    std::memcpy(b.exp_avg, model.state->exp_avg(i), sizes[i] * 4);
    std::memcpy(b.exp_avg_sq, model.state->exp_avg_sq(i), sizes[i] * 4);
  }
  const std::uint8_t two[] = {0, 0};
  EXPECT_EQ(tide_optimizer_set_frozen(opt, two, 1), TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("created with 2"), std::string::npos);
  ASSERT_EQ(tide_optimizer_set_frozen(opt, two, 2), TIDE_OK);
  std::vector<std::uint8_t> outcome(sizes.size(), 0xff);

  auto grads = model.make_gradients(1);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_EQ(tide_optimizer_offload_gradient(opt, i, 0, model.grads[i].get(), sizes[i],
                                              TIDE_BFLOAT16, nullptr),
              TIDE_OK);
  }
  const kernels::AdamHyper h = hyper(1);
  const tide_adam_hyper ch{h.lr,         h.beta1, h.beta2, h.eps, h.weight_decay,
                           h.grad_scale, h.step,  1,       0};
  ASSERT_EQ(tide_optimizer_ready(opt, &ch), TIDE_OK) << tide::capi::last_error_text();
  void* standin = dlopen(std::getenv("TIDE_CUDA_DRIVER"), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(standin, nullptr);
  auto lose = reinterpret_cast<int (*)(std::uint64_t)>(dlsym(standin, "tide_standin_device_lost"));
  ASSERT_NE(lose, nullptr);
  ASSERT_EQ(lose(1), 0);
  const tide_placement_policy gpu{TIDE_PLACEMENT_GPU, 0};
  tide_step_result report = tide_step_result_default();
  report.subgroup_outcome = outcome.data();
  // The step happened (TIDE_OK), after a fault: its one result says so, and why.
  EXPECT_EQ(tide::test::step_once(opt, &ch, &gpu, 1 << 30, &report), TIDE_OK);
  EXPECT_EQ(report.outcome, TIDE_STEP_COMPLETED_AFTER_FAULT);
  EXPECT_EQ(report.status, TIDE_OK);
  EXPECT_NE(std::string(report.reason).find("could not be written"), std::string::npos)
      << report.reason;
  EXPECT_STREQ(tide::capi::last_error_text(), "");  // no warning channel
  EXPECT_EQ(report.unwritten, 2u);
  EXPECT_EQ(report.rolled_forward, 2u);
  EXPECT_EQ(outcome, (std::vector<std::uint8_t>{TIDE_SUBGROUP_UNWRITTEN, TIDE_SUBGROUP_UNWRITTEN}));
  ref.step(grads, h);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    tide_subgroup_buffers b;
    ASSERT_EQ(tide_optimizer_buffers(opt, i, &b), TIDE_OK);
    EXPECT_EQ(0, std::memcmp(b.param, ref.p[i].data(), sizes[i] * 4));  // the state completed
  }
  EXPECT_EQ(tide_optimizer_write_params(opt), TIDE_ERROR_CUDA);  // the device is still lost
  ASSERT_EQ(lose(0), 0);
  ASSERT_EQ(tide_optimizer_write_params(opt), TIDE_OK) << tide::capi::last_error_text();
  for (std::size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(model.device_params(i), ref.copy[i]);
  EXPECT_EQ(tide_optimizer_destroy(opt), TIDE_OK);
  dlclose(standin);
}

// host_params: fp32 parameters in host memory are the master weights (no param or grad buffer),
// the gradients given per slice and read in place; the bad uses are refused by name.
TEST(ExecutorCapi, HostParamsStepInPlaceWithGradientsGivenPerSlice) {
  const driver::CurrentContext context;
  std::vector<float> params(300), grads(300), expected(300);
  for (std::size_t e = 0; e < params.size(); ++e) {
    params[e] = expected[e] = value_at(1, e, 1.0f);
    grads[e] = value_at(2, e, 0.5f);
  }
  const std::uint64_t sizes[] = {200, 100};
  // Two parameters of 150: the first all in subgroup 0, the second straddling both.
  const auto at = [&](std::size_t e) { return reinterpret_cast<std::uint64_t>(&params[e]); };
  const tide_param_slice slices[] = {
      {0, 0, 150, at(0)}, {0, 150, 50, at(150)}, {1, 0, 100, at(200)}};
  tide_optimizer_options options;
  options = tide_optimizer_options_default();
  EXPECT_EQ(options.host_params, 0);
  options.grad_dtype = options.param_dtype = TIDE_FLOAT32;
  options.host_params = 1;
  tide_optimizer* opt = nullptr;
  ASSERT_EQ(tide_optimizer_create(sizes, 2, slices, 3, &options, nullptr, &opt), TIDE_OK)
      << tide::capi::last_error_text();
  tide_subgroup_buffers b;
  ASSERT_EQ(tide_optimizer_buffers(opt, 0, &b), TIDE_OK);
  EXPECT_EQ(b.param, nullptr);
  EXPECT_EQ(b.grad, nullptr);
  EXPECT_NE(b.exp_avg, nullptr);
  EXPECT_EQ(tide_optimizer_offload_gradient(opt, 0, 0, at(0), 10, TIDE_FLOAT32, nullptr),
            TIDE_ERROR_INVALID_ARGUMENT);
  const std::uint64_t two[] = {1, 2};
  EXPECT_EQ(tide_optimizer_set_gradients(opt, two, 2), TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("slice_count"), std::string::npos);
  const std::uint64_t given[] = {reinterpret_cast<std::uint64_t>(&grads[0]),
                                 reinterpret_cast<std::uint64_t>(&grads[150]),
                                 reinterpret_cast<std::uint64_t>(&grads[200])};
  ASSERT_EQ(tide_optimizer_set_gradients(opt, given, 3), TIDE_OK);
  const kernels::AdamHyper h = hyper(1);
  const tide_adam_hyper ch{h.lr,         h.beta1, h.beta2, h.eps, h.weight_decay,
                           h.grad_scale, h.step,  1,       0};
  const tide_placement_policy policy{TIDE_PLACEMENT_GPU, 0};
  tide_step_result report = tide_step_result_default();
  ASSERT_EQ(tide::test::step_once(opt, &ch, &policy, 1u << 30, &report), TIDE_OK)
      << tide::capi::last_error_text();
  EXPECT_EQ(report.gpu_subgroups, 2u);
  std::vector<float> m(300, 0.0f), v(300, 0.0f);
  kernels::AdamSubgroup sub;
  sub.grad = grads.data();
  sub.param = expected.data();
  sub.exp_avg = m.data();
  sub.exp_avg_sq = v.data();
  sub.count = 300;
  sub.grad_dtype = Dtype::kFloat32;
  kernels::cpu_adam_step(sub, h);
  EXPECT_EQ(params, expected);
  // The gradients were forgotten with the step: a step without new ones is refused.
  EXPECT_EQ(tide::test::step_once(opt, &ch, &policy, 1u << 30, &report),
            TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(params, expected);
  ASSERT_EQ(tide_optimizer_destroy(opt), TIDE_OK);

  // bf16 master weights need bf16 parameters: never with host_params, whatever the dtypes.
  for (const tide_dtype param_dtype : {TIDE_FLOAT32, TIDE_BFLOAT16}) {
    options.grad_dtype = options.param_dtype = param_dtype;
    options.master_dtype = TIDE_BFLOAT16;
    EXPECT_EQ(tide_optimizer_create(sizes, 2, slices, 3, &options, nullptr, &opt),
              TIDE_ERROR_INVALID_ARGUMENT);
    const std::string error = tide::capi::last_error_text();
    EXPECT_NE(error.find("host-resident parameters are their own fp32 master weights; bf16 master "
                         "weights need bf16 parameters"),
              std::string::npos)
        << error;
  }
  options.grad_dtype = options.param_dtype = TIDE_FLOAT32;
  options.master_dtype = TIDE_FLOAT32;

  // Without host_params there is nothing to set.
  options.host_params = 0;
  ASSERT_EQ(tide_optimizer_create(sizes, 2, slices, 3, &options, nullptr, &opt), TIDE_OK);
  EXPECT_EQ(tide_optimizer_set_gradients(opt, given, 3), TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("host_params"), std::string::npos);
  ASSERT_EQ(tide_optimizer_destroy(opt), TIDE_OK);
}

TEST(ExecutorPolicy, ParsesAndNames) {
  EXPECT_EQ(policy_name(parse_policy("auto")), "auto");
  EXPECT_EQ(policy_name(parse_policy("cpu")), "cpu");
  EXPECT_EQ(policy_name(parse_policy("gpu")), "gpu");
  EXPECT_EQ(policy_name(parse_policy("4")), "k4");
  EXPECT_EQ(policy_name(parse_policy("k2")), "k2");
  EXPECT_EQ(policy_name(Policy::first(3)), "first3");
  for (const char* bad : {"", "0", "k0", "K", "two", "1.5", "99999999999999999999"}) {
    EXPECT_THROW(parse_policy(bad), std::invalid_argument) << bad;
  }
}

}  // namespace
}  // namespace tide::runtime::testing
