// The C ABI of the optimizer kernels (include/tide/tide.h, "optimizer kernels").
#include <stdexcept>
#include <string>

#include "capi/kernels.h"
#include "capi/status.h"
#include "capi/versioned.h"
#include "kernels/cpu_adam.h"
#include "kernels/thread_pool.h"
#include "tide/tide.h"

namespace tide::capi {

using namespace tide::kernels;

namespace {

CpuAdamOptions options_of(const tide_cpu_options* given) {
  CpuAdamOptions options;
  if (given == nullptr) return options;
  const tide_cpu_options c = read_versioned(*given, tide_cpu_options_default(), "tide_cpu_options");
  const tide_cpu_options* o = &c;
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
                                        const tide_state_format* format,
                                        const tide_adam_hyper* hyper,
                                        const tide_cpu_options* options, tide_adam_result* result) {
  return guard([&] {
    capi::require(subgroup != nullptr && hyper != nullptr, "tide_cpu_adam_step: null argument");
    const tide_state_format f =
        format == nullptr
            ? tide_state_format_default()
            : capi::read_versioned(*format, tide_state_format_default(), "tide_state_format");
    if (result != nullptr) {
      capi::check_struct_size<tide_adam_result>(result->struct_size, "tide_adam_result");
    }
    k::AdamSubgroup s = capi::subgroup_from_c(*subgroup);
    k::AdamHyper h = capi::hyper_from_c(*hyper);
    if (subgroup->state_dtype == TIDE_STATE_BLOCK_Q8) {
      capi::require(f.exp_avg_scale != nullptr && f.exp_avg_sq_scale != nullptr,
                    "tide_cpu_adam_step: 8-bit moments (state_dtype TIDE_STATE_BLOCK_Q8) need "
                    "their block scales: format->exp_avg_scale and exp_avg_sq_scale");
      s.exp_avg_scale = f.exp_avg_scale;
      s.exp_avg_sq_scale = f.exp_avg_sq_scale;
    }
    switch (f.master_dtype) {
      case TIDE_FLOAT32:
        break;
      case TIDE_BFLOAT16:
        capi::require(subgroup->param == nullptr,
                      "tide_cpu_adam_step: bf16 master weights: subgroup->param must be NULL (the "
                      "weights are format->param_bf16 and param_comp)");
        capi::require(subgroup->state_dtype != TIDE_STATE_BLOCK_Q8,
                      "tide_cpu_adam_step: bf16 master weights with 8-bit moments are not "
                      "supported (use fp32 or bf16 moments)");
        s.master_dtype = k::Dtype::kBFloat16;
        s.param_bf16 = f.param_bf16;
        s.param_comp = f.param_comp;
        break;
      default:
        throw std::invalid_argument(
            "tide_cpu_adam_step: format->master_dtype must be TIDE_FLOAT32 or TIDE_BFLOAT16, not " +
            std::to_string(f.master_dtype));
    }
    capi::require(
        f.rounding == TIDE_STATE_ROUNDING_NEAREST || f.rounding == TIDE_STATE_ROUNDING_STOCHASTIC,
        "tide_cpu_adam_step: format->rounding must be TIDE_STATE_ROUNDING_NEAREST (0) or "
        "TIDE_STATE_ROUNDING_STOCHASTIC (1)");
    if (f.rounding == TIDE_STATE_ROUNDING_STOCHASTIC) {
      capi::require(subgroup->state_dtype == TIDE_BFLOAT16,
                    "tide_cpu_adam_step: stochastic rounding needs bf16 moments (state_dtype "
                    "TIDE_BFLOAT16)");
      s.moment_rounding = k::MomentRounding::kStochastic;
      s.rounding_index = f.first_index;
      h.rounding_seed = f.seed;
    }
    const k::AdamResult r = k::cpu_adam_step(s, h, capi::options_of(options));
    if (result != nullptr) {
      capi::write_versioned(
          result, tide_adam_result{sizeof(tide_adam_result), r.nonfinite, r.applied ? 1 : 0},
          "tide_adam_result");
    }
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
    out.struct_size = sizeof(tide_cpu_info);
    out.best_isa = capi::abi_isa(k::default_cpu_isa());
    for (k::CpuIsa isa : k::kCpuIsas) {
      if (k::cpu_supports(isa)) out.supported_isas |= 1 << capi::abi_isa(isa);
    }
    out.threads = static_cast<std::int32_t>(k::cpu_pool().size());
    capi::write_versioned(info, out, "tide_cpu_info");
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
