// The C ABI of the optimizer kernels (include/tide/tide.h, "optimizer kernels").
#include <stdexcept>
#include <string>

#include "capi/kernels.h"
#include "capi/status.h"
#include "kernels/cpu_adam.h"
#include "kernels/thread_pool.h"
#include "tide/tide.h"

namespace tide::capi {

using namespace tide::kernels;

namespace {

CpuAdamOptions options_of(const tide_cpu_options* o) {
  CpuAdamOptions options;
  if (o == nullptr) return options;
  require(o->threads >= 0, "tide: tide_cpu_options.threads must be >= 0");
  options.threads = static_cast<unsigned>(o->threads);
  switch (o->isa) {
    case TIDE_CPU_ISA_AUTO:
      break;
    case TIDE_CPU_ISA_SCALAR:
    case TIDE_CPU_ISA_AVX2:
    case TIDE_CPU_ISA_AVX512:
    case TIDE_CPU_ISA_AVX512_BF16:
      options.force_isa = true;
      options.isa = static_cast<CpuIsa>(o->isa - TIDE_CPU_ISA_SCALAR);
      break;
    default:
      throw std::invalid_argument("tide: unknown tide_cpu_options.isa");
  }
  options.skip_subgroup_on_nonfinite = o->skip_subgroup_on_nonfinite != 0;
  return options;
}

std::int32_t abi_isa(CpuIsa isa) { return static_cast<std::int32_t>(isa) + TIDE_CPU_ISA_SCALAR; }

AdamSubgroup subgroup_from_c(const tide_adam_subgroup& s) {
  const bool q8 = s.state_dtype == TIDE_STATE_BLOCK_Q8;
  return AdamSubgroup{
      .grad = s.grad,
      .param = s.param,
      .exp_avg = s.exp_avg,
      .exp_avg_sq = s.exp_avg_sq,
      .param_copy = s.param_copy,
      .count = s.count,
      .grad_dtype = dtype_from_c(s.grad_dtype, "tide_cpu_adam_step: grad_dtype"),
      .state_dtype =
          q8 ? Dtype::kFloat32 : dtype_from_c(s.state_dtype, "tide_cpu_adam_step: state_dtype"),
      .copy_dtype = s.param_copy != nullptr
                        ? dtype_from_c(s.copy_dtype, "tide_cpu_adam_step: copy_dtype")
                        : AdamSubgroup{}.copy_dtype,
      .state_format = q8 ? StateFormat::kBlockQ8 : StateFormat::kDtype};
}

}  // namespace

Dtype dtype_from_c(std::int32_t dtype, std::string_view what) {
  if (dtype != TIDE_FLOAT32 && dtype != TIDE_BFLOAT16 && dtype != TIDE_FLOAT16) {
    throw std::invalid_argument(std::string(what) + " is not a tide_dtype (" +
                                std::to_string(dtype) + "; 0 float32, 1 bfloat16, 2 float16)");
  }
  return static_cast<Dtype>(dtype);
}

AdamHyper hyper_from_c(const tide_adam_hyper& h) {
  return AdamHyper{.lr = h.lr,
                   .beta1 = h.beta1,
                   .beta2 = h.beta2,
                   .eps = h.eps,
                   .weight_decay = h.weight_decay,
                   .step = h.step,
                   .decoupled = h.decoupled != 0,
                   .maximize = h.maximize != 0,
                   .grad_scale = h.grad_scale};
}

}  // namespace tide::capi

using tide::capi::guard;
namespace k = tide::kernels;
namespace capi = tide::capi;

extern "C" {

TIDE_API tide_status tide_cpu_adam_step(const tide_adam_subgroup* subgroup,
                                        const tide_adam_hyper* hyper,
                                        const tide_cpu_options* options, tide_adam_result* result) {
  return guard([&] {
    capi::require(subgroup != nullptr && hyper != nullptr, "tide_cpu_adam_step: null argument");
    capi::require(subgroup->state_dtype != TIDE_STATE_BLOCK_Q8,
                  "tide_cpu_adam_step: 8-bit moments need their scales: tide_cpu_adam_step_q8");
    const k::AdamResult r = k::cpu_adam_step(capi::subgroup_from_c(*subgroup),
                                             capi::hyper_from_c(*hyper), capi::options_of(options));
    if (result != nullptr) *result = tide_adam_result{r.nonfinite, r.applied ? 1 : 0, 0};
  });
}

TIDE_API tide_status tide_cpu_adam_step_q8(const tide_adam_subgroup* subgroup, float* exp_avg_scale,
                                           float* exp_avg_sq_scale, const tide_adam_hyper* hyper,
                                           const tide_cpu_options* options,
                                           tide_adam_result* result) {
  return guard([&] {
    capi::require(subgroup != nullptr && hyper != nullptr, "tide_cpu_adam_step_q8: null argument");
    capi::require(subgroup->state_dtype == TIDE_STATE_BLOCK_Q8,
                  "tide_cpu_adam_step_q8: state_dtype must be TIDE_STATE_BLOCK_Q8 (8-bit moments)");
    k::AdamSubgroup s = capi::subgroup_from_c(*subgroup);
    s.exp_avg_scale = exp_avg_scale;
    s.exp_avg_sq_scale = exp_avg_sq_scale;
    const k::AdamResult r =
        k::cpu_adam_step(s, capi::hyper_from_c(*hyper), capi::options_of(options));
    if (result != nullptr) *result = tide_adam_result{r.nonfinite, r.applied ? 1 : 0, 0};
  });
}

TIDE_API tide_status tide_cpu_adam_step_bf16_master(const tide_adam_subgroup* subgroup,
                                                    uint16_t* param_bf16, uint16_t* param_comp,
                                                    const tide_adam_hyper* hyper,
                                                    const tide_cpu_options* options,
                                                    tide_adam_result* result) {
  return guard([&] {
    capi::require(subgroup != nullptr && hyper != nullptr,
                  "tide_cpu_adam_step_bf16_master: null argument");
    capi::require(subgroup->param == nullptr,
                  "tide_cpu_adam_step_bf16_master: subgroup->param must be NULL (the weights are "
                  "param_bf16 and param_comp)");
    capi::require(subgroup->state_dtype != TIDE_STATE_BLOCK_Q8,
                  "tide_cpu_adam_step_bf16_master: bf16 master weights with 8-bit moments are not "
                  "supported (use fp32 or bf16 moments)");
    k::AdamSubgroup s = capi::subgroup_from_c(*subgroup);
    s.master_dtype = k::Dtype::kBFloat16;
    s.param_bf16 = param_bf16;
    s.param_comp = param_comp;
    const k::AdamResult r =
        k::cpu_adam_step(s, capi::hyper_from_c(*hyper), capi::options_of(options));
    if (result != nullptr) *result = tide_adam_result{r.nonfinite, r.applied ? 1 : 0, 0};
  });
}

TIDE_API tide_status tide_cpu_adam_step_sr(const tide_adam_subgroup* subgroup, int32_t rounding,
                                           uint64_t seed, uint64_t first_index,
                                           const tide_adam_hyper* hyper,
                                           const tide_cpu_options* options,
                                           tide_adam_result* result) {
  return guard([&] {
    capi::require(subgroup != nullptr && hyper != nullptr, "tide_cpu_adam_step_sr: null argument");
    capi::require(
        rounding == TIDE_STATE_ROUNDING_NEAREST || rounding == TIDE_STATE_ROUNDING_STOCHASTIC,
        "tide_cpu_adam_step_sr: rounding must be TIDE_STATE_ROUNDING_NEAREST (0) or "
        "TIDE_STATE_ROUNDING_STOCHASTIC (1)");
    capi::require(subgroup->state_dtype == TIDE_BFLOAT16,
                  "tide_cpu_adam_step_sr: the moments must be bf16 (state_dtype TIDE_BFLOAT16)");
    k::AdamSubgroup s = capi::subgroup_from_c(*subgroup);
    s.moment_rounding = rounding == TIDE_STATE_ROUNDING_STOCHASTIC ? k::MomentRounding::kStochastic
                                                                   : k::MomentRounding::kNearest;
    s.rounding_index = first_index;
    k::AdamHyper h = capi::hyper_from_c(*hyper);
    h.rounding_seed = seed;
    const k::AdamResult r = k::cpu_adam_step(s, h, capi::options_of(options));
    if (result != nullptr) *result = tide_adam_result{r.nonfinite, r.applied ? 1 : 0, 0};
  });
}

TIDE_API tide_status tide_cpu_count_nonfinite(const void* values, int32_t dtype, uint64_t count,
                                              const tide_cpu_options* options,
                                              uint64_t* nonfinite) {
  return guard([&] {
    capi::require(nonfinite != nullptr, "tide_cpu_count_nonfinite: null output pointer");
    *nonfinite =
        k::cpu_count_nonfinite(values, capi::dtype_from_c(dtype, "tide_cpu_count_nonfinite: dtype"),
                               count, capi::options_of(options));
  });
}

TIDE_API tide_status tide_cpu_cast(const float* src, void* dst, int32_t dst_dtype, uint64_t count,
                                   const tide_cpu_options* options) {
  return guard([&] {
    k::cpu_cast(src, dst, capi::dtype_from_c(dst_dtype, "tide_cpu_cast: dst_dtype"), count,
                capi::options_of(options));
  });
}

TIDE_API tide_status tide_cpu_kernels_info(tide_cpu_info* info) {
  return guard([&] {
    capi::require(info != nullptr, "tide_cpu_kernels_info: null output pointer");
    tide_cpu_info out{};
    out.best_isa = capi::abi_isa(k::default_cpu_isa());
    for (k::CpuIsa isa : k::kCpuIsas) {
      if (k::cpu_supports(isa)) out.supported_isas |= 1 << capi::abi_isa(isa);
    }
    out.threads = static_cast<std::int32_t>(k::cpu_pool().size());
    *info = out;
  });
}

TIDE_API tide_status tide_q8_code_maps(const float** exp_avg_magnitudes,
                                       const float** exp_avg_midpoints,
                                       const float** exp_avg_sq_values,
                                       const float** exp_avg_sq_midpoints) {
  return guard([&] {
    if (exp_avg_magnitudes != nullptr) *exp_avg_magnitudes = k::kQ8SignedMagnitudes;
    if (exp_avg_midpoints != nullptr) *exp_avg_midpoints = k::kQ8SignedMidpoints;
    if (exp_avg_sq_values != nullptr) *exp_avg_sq_values = k::kQ8UnsignedValues;
    if (exp_avg_sq_midpoints != nullptr) *exp_avg_sq_midpoints = k::kQ8UnsignedMidpoints;
  });
}

}  // extern "C"
