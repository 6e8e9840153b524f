// The launcher of the fused CUDA Adam kernel (kernels/cuda/adam.cu): loads the embedded fatbin
// through driver/ and launches tide_adam_step on a stream. Against the host stand-in driver the
// same calls run the kernel's own source compiled for the host (kernels/host_kernel.h).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <optional>
#include <span>

#include "driver/module.h"
#include "kernels/adam_kernel.h"
#include "kernels/adam_math.h"
#include "kernels/dtype.h"

namespace tide::driver {
class Stream;
}

namespace tide::kernels {

// One subgroup in device memory; every buffer `count` elements, aligned to its element size.
// param_copy may be the gradient itself when both have the same element size (the executor puts
// the new weights over the gradient the kernel has read): each element's gradient is read
// before its copy is written, by the same thread, in the kernel and in every CPU variant.
struct AdamGpuSubgroup {
  CUdeviceptr grad = 0;
  CUdeviceptr param = 0;  // fp32 master weights; 0 with bf16 master weights (param_bf16)
  CUdeviceptr exp_avg = 0;
  CUdeviceptr exp_avg_sq = 0;
  CUdeviceptr param_copy = 0;  // required when the launch has a copy dtype, else ignored
  std::uint64_t count = 0;
  // 8-bit moments (state_format kBlockQ8, kernels/quant8.h): exp_avg and exp_avg_sq are `count`
  // codes each at a kQuantBlock-byte boundary, these quant_blocks(count) fp32 scales each.
  CUdeviceptr exp_avg_scale = 0;
  CUdeviceptr exp_avg_sq_scale = 0;
  // bf16 master weights (AdamGpuDtypes::master kBFloat16), as cpu_adam.h's AdamSubgroup names
  // them: param_bf16 the bf16 weights and param_comp their bf16 compensation
  // (kernels/adam_math.h, adam_master_element), both updated in place; `param` is then 0.
  CUdeviceptr param_bf16 = 0;
  CUdeviceptr param_comp = 0;
  // With AdamGpuDtypes::rounding kStochastic: the global index of element 0 in the optimizer's
  // flat state (kernels/stochastic_round.h).
  std::uint64_t rounding_index = 0;
};

// The dtypes every subgroup of one launch shares.
struct AdamGpuDtypes {
  Dtype grad = Dtype::kBFloat16;
  Dtype state = Dtype::kFloat32;
  std::optional<Dtype> copy = Dtype::kBFloat16;    // nullopt: no low-precision copy
  StateFormat state_format = StateFormat::kDtype;  // kBlockQ8: `state` is ignored
  // kBFloat16: bf16 master weights with compensation; no copy, not with kBlockQ8.
  Dtype master = Dtype::kFloat32;
  // kStochastic: bf16 moments rounded stochastically (kernels/stochastic_round.h; the key from
  // AdamHyper::rounding_seed and step). Needs state kBFloat16, kDtype and fp32 master weights.
  MomentRounding rounding = MomentRounding::kNearest;
};

class AdamGpu {
 public:
  // Loads the kernels' module into the context current on this thread (driver/context.h).
  AdamGpu();

  // Enqueues one Adam/AdamW step over `subgroups` on `stream`: their weights, moments and
  // copies are updated when the stream reaches this point. `nonfinite` is device memory for
  // subgroups.size() unsigned 64-bit counters: zeroed here first, then each receives the
  // number of its subgroup's elements left unchanged because their gradient or update was not
  // finite (as cpu_adam_step reports). Launches ⌈n / kMaxAdamKernelSubgroups⌉ kernels.
  // Throws std::invalid_argument for bad dtypes, pointers or hyperparameters, CudaError for a
  // failed driver call.
  void step(std::span<const AdamGpuSubgroup> subgroups, const AdamGpuDtypes& dtypes,
            const AdamHyper& hyper, CUdeviceptr nonfinite, const driver::Stream& stream) const;

  // The launch shape for subgroups of at most `max_count` elements, in `rows` grid rows.
  static driver::LaunchShape shape(std::uint64_t max_count, unsigned rows);

 private:
  driver::Module module_;
  CUfunction kernel_ = nullptr;
  CUfunction kernel_q8_ = nullptr;  // 8-bit moments
};

}  // namespace tide::kernels
