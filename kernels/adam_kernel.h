// The fused CUDA Adam kernel (kernels/cuda/adam.cu): its parameter struct, shared by the kernel,
// its launcher (kernels/adam_gpu.h) and its host build (kernels/adam_host.cpp).
//
// One launch updates up to kMaxAdamKernelSubgroups flat subgroups that share their dtypes: grid
// row blockIdx.y works on subgroup blockIdx.y. The subgroup descriptors travel inside the
// parameter struct (by value, as every tide kernel takes its parameters), so a launch needs no
// descriptor upload.
#pragma once

#include <cstdint>

#include "kernels/adam_math.h"
#include "kernels/dtype.h"
#include "kernels/host_device.h"
#include "kernels/quant8.h"
#include "kernels/stochastic_round.h"

namespace tide::kernels {

// One subgroup in device memory (CUdeviceptr addresses): `count` elements of each buffer.
struct AdamKernelSubgroup {
  std::uint64_t grad;        // grad_dtype
  std::uint64_t param;       // float; bf16 with master_dtype kBFloat16
  std::uint64_t exp_avg;     // state_dtype
  std::uint64_t exp_avg_sq;  // state_dtype
  std::uint64_t param_copy;  // copy_dtype; unused when has_copy is 0
  std::uint64_t count;
  std::uint64_t exp_avg_scale;     // float[quant_blocks(count)]; with state_format kBlockQ8 only
  std::uint64_t exp_avg_sq_scale;  // float[quant_blocks(count)]; with state_format kBlockQ8 only
  std::uint64_t param_comp;        // bf16; with master_dtype kBFloat16 only
  // The global index of element 0, for stochastic rounding (kernels/stochastic_round.h).
  std::uint64_t rounding_index = 0;
};

inline constexpr unsigned kMaxAdamKernelSubgroups = 32;

struct AdamKernelParams {
  AdamCoefficients terms;
  // unsigned long long* in device memory: one counter per subgroup, which the kernel adds its
  // rejected (non-finite) elements to. The launcher zeroes them first.
  std::uint64_t nonfinite;
  std::uint32_t subgroup_count;
  Dtype grad_dtype;
  Dtype state_dtype;  // kFloat32 or kBFloat16
  Dtype copy_dtype;   // kBFloat16 or kFloat16
  std::uint8_t has_copy;
  // kBlockQ8 (launch kAdamQ8Kernel): exp_avg and exp_avg_sq are 8-bit codes (kernels/quant8.h),
  // each quantization block stepped by one warp (blockDim.x must be a multiple of 32);
  // state_dtype is ignored.
  StateFormat state_format;
  // kBFloat16: bf16 master weights with compensation (adam_master_element): param holds the bf16
  // weights and param_comp their compensation; no copy, state_format kDtype (tide_adam_step).
  Dtype master_dtype;
  // kStochastic: bf16 moments (state_dtype kBFloat16, kDtype, fp32 master) rounded with
  // terms.rounding_key and each subgroup's rounding_index (kernels/stochastic_round.h).
  MomentRounding moment_rounding;
  AdamKernelSubgroup subgroups[kMaxAdamKernelSubgroups];
};

// CUDA's kernel parameter limit before 12.1 (and on the stand-in's launch path).
static_assert(sizeof(AdamKernelParams) <= 4096);

inline constexpr const char* kAdamKernel = "tide_adam_step";
// The same parameters with state_format kBlockQ8 (a kernel of its own: kernels/cuda/adam.cu).
inline constexpr const char* kAdamQ8Kernel = "tide_adam_step_q8";

// Threads per block and elements per thread and step of the kernel's vector path (16-byte
// loads of 16-bit values, two of fp32).
inline constexpr unsigned kAdamBlockThreads = 256;
inline constexpr unsigned kAdamVectorElements = 8;

// The elements of a subgroup (fp32 master weights) stepped one by one before its vector path
// starts: where every buffer is at a common kAdamVectorElements boundary; all of them (~0) when
// the buffers never are together, and the subgroup goes one element at a time. Element sizes
// are the gradient's, the moments' and, with a low-precision copy (2 bytes), the copy's (0:
// none). The kernel's rule, and its launchers' (a resident update that writes the model itself
// keeps to slices that stay on the vector path).
TIDE_HOST_DEVICE std::uint64_t adam_vector_head(const AdamKernelSubgroup& s, unsigned grad_size,
                                                unsigned state_size, unsigned copy_size) {
  constexpr unsigned kV = kAdamVectorElements;
  auto head_of = [](std::uint64_t address, unsigned size) -> std::uint64_t {
    const std::uint64_t element = address / size;
    return (kV - element % kV) % kV;
  };
  const std::uint64_t head = head_of(s.param, 4);
  bool together = head_of(s.grad, grad_size) == head && head_of(s.exp_avg, state_size) == head &&
                  head_of(s.exp_avg_sq, state_size) == head;
  if (copy_size != 0) together = together && head_of(s.param_copy, copy_size) == head;
  return together ? head : ~std::uint64_t{0};
}

}  // namespace tide::kernels
