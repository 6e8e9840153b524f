// The C ABI of the optimizer kernels (include/tide/tide.h, "optimizer kernels").
#include <stdexcept>

#include "capi/status.h"
#include "kernels/cpu_adam.h"
#include "kernels/thread_pool.h"
#include "tide/tide.h"

namespace tide::kernels {
namespace {

void require(bool ok, const char* message) {
  if (!ok) throw std::invalid_argument(message);
}

Dtype dtype_of(std::int32_t d, const char* what) {
  require(d == TIDE_FLOAT32 || d == TIDE_BFLOAT16 || d == TIDE_FLOAT16, what);
  return static_cast<Dtype>(d);
}

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

}  // namespace
}  // namespace tide::kernels

using tide::capi::guard;
namespace k = tide::kernels;

extern "C" {

TIDE_API tide_status tide_cpu_adam_step(const tide_adam_subgroup* subgroup,
                                        const tide_adam_hyper* hyper,
                                        const tide_cpu_options* options, tide_adam_result* result) {
  return guard([&] {
    k::require(subgroup != nullptr && hyper != nullptr, "tide_cpu_adam_step: null argument");
    k::AdamSubgroup s;
    s.grad = subgroup->grad;
    s.param = subgroup->param;
    s.exp_avg = subgroup->exp_avg;
    s.exp_avg_sq = subgroup->exp_avg_sq;
    s.param_copy = subgroup->param_copy;
    s.count = subgroup->count;
    s.grad_dtype = k::dtype_of(subgroup->grad_dtype, "tide_cpu_adam_step: unknown grad_dtype");
    s.state_dtype = k::dtype_of(subgroup->state_dtype, "tide_cpu_adam_step: unknown state_dtype");
    if (s.param_copy != nullptr) {
      s.copy_dtype = k::dtype_of(subgroup->copy_dtype, "tide_cpu_adam_step: unknown copy_dtype");
    }
    k::AdamHyper h;
    h.lr = hyper->lr;
    h.beta1 = hyper->beta1;
    h.beta2 = hyper->beta2;
    h.eps = hyper->eps;
    h.weight_decay = hyper->weight_decay;
    h.grad_scale = hyper->grad_scale;
    h.step = hyper->step;
    h.decoupled = hyper->decoupled != 0;
    h.maximize = hyper->maximize != 0;
    const k::AdamResult r = k::cpu_adam_step(s, h, k::options_of(options));
    if (result != nullptr) *result = tide_adam_result{r.nonfinite, r.applied ? 1 : 0, 0};
  });
}

TIDE_API tide_status tide_cpu_count_nonfinite(const void* values, int32_t dtype, uint64_t count,
                                              const tide_cpu_options* options,
                                              uint64_t* nonfinite) {
  return guard([&] {
    k::require(nonfinite != nullptr, "tide_cpu_count_nonfinite: null output pointer");
    *nonfinite = k::cpu_count_nonfinite(
        values, k::dtype_of(dtype, "tide_cpu_count_nonfinite: unknown dtype"), count,
        k::options_of(options));
  });
}

TIDE_API tide_status tide_cpu_cast(const float* src, void* dst, int32_t dst_dtype, uint64_t count,
                                   const tide_cpu_options* options) {
  return guard([&] {
    k::cpu_cast(src, dst, k::dtype_of(dst_dtype, "tide_cpu_cast: unknown dtype"), count,
                k::options_of(options));
  });
}

TIDE_API tide_status tide_cpu_kernels_info(tide_cpu_info* info) {
  return guard([&] {
    k::require(info != nullptr, "tide_cpu_kernels_info: null output pointer");
    tide_cpu_info out{};
    out.best_isa = k::abi_isa(k::default_cpu_isa());
    for (k::CpuIsa isa : {k::CpuIsa::kScalar, k::CpuIsa::kAvx2, k::CpuIsa::kAvx512}) {
      if (k::cpu_supports(isa)) out.supported_isas |= 1 << k::abi_isa(isa);
    }
    out.threads = static_cast<std::int32_t>(k::cpu_pool().size());
    *info = out;
  });
}

}  // extern "C"
