// The CPU Adam/AdamW update of one subgroup, at the host's memory bandwidth.
//
// One pass over the subgroup reads the gradients and the fp32 master weights and moments, and
// writes the updated weights and moments and, in the same pass, the low-precision copy of the
// weights that goes back to the GPU. The pass runs on the process's CPU thread pool
// (kernels/thread_pool.h) with the widest instruction set the CPU has (AVX-512, AVX2 or
// scalar, chosen at run time, or forced with TIDE_CPU_ISA; every one computes the same bits).
//
// Non-finite values: an element whose gradient is not finite (or whose update overflows) keeps
// its old weight, moments and copy; nothing non-finite that the gradient brings is ever written,
// so there is nothing to roll back. The result counts such elements. With 8-bit moments
// (kernels/quant8.h) a rejected element keeps its weight bit for bit and its moments' values
// (the dequantized ones), which are requantized with their block: under the block's new scale
// their codes may move by rounding. A block whose stored scale is not finite (corrupt state) has
// every element rejected, and keeps its codes and scales as they were. A loss scaler that must skip
// the whole step when any gradient is non-finite checks the gradients first
// (cpu_count_nonfinite, cheap: it reads the gradients only, e.g. as each subgroup's gradients
// arrive) or sets CpuAdamOptions::skip_subgroup_on_nonfinite.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "kernels/adam_math.h"
#include "kernels/dtype.h"
#include "kernels/quant8.h"
#include "kernels/stochastic_round.h"

namespace tide::kernels {

// One flat subgroup in host memory: `count` elements of each buffer, any alignment of the
// element type's own (4 bytes for fp32, 2 for bf16/fp16). With state_format kBlockQ8 the moments
// are 8-bit codes (kernels/quant8.h): exp_avg and exp_avg_sq hold `count` bytes each and start at
// a kQuantBlock-byte boundary, exp_avg_scale and exp_avg_sq_scale quant_blocks(count) fp32
// scales each; state_dtype is then ignored.
struct AdamSubgroup {
  const void* grad = nullptr;  // Dtype grad_dtype: kFloat32, kBFloat16 or kFloat16
  float* param = nullptr;      // fp32 master weights, updated in place
  void* exp_avg = nullptr;     // first moment, Dtype state_dtype: kFloat32 or kBFloat16
  void* exp_avg_sq = nullptr;  // second moment, same dtype
  void* param_copy = nullptr;  // optional output: the weights cast to copy_dtype (kBFloat16 or
                               // kFloat16); nullptr for none
  std::size_t count = 0;
  Dtype grad_dtype = Dtype::kFloat32;
  Dtype state_dtype = Dtype::kFloat32;
  Dtype copy_dtype = Dtype::kBFloat16;
  StateFormat state_format = StateFormat::kDtype;
  float* exp_avg_scale = nullptr;     // kBlockQ8: the first moment's block scales
  float* exp_avg_sq_scale = nullptr;  // kBlockQ8: the second moment's block scales
  // kBFloat16: bf16 master weights with compensation (adam_master_element): param is nullptr,
  // param_bf16 holds the bf16 weights (the model's, no copy: param_copy must be nullptr) and
  // param_comp their bf16 compensation, both updated in place. Not with kBlockQ8 moments.
  Dtype master_dtype = Dtype::kFloat32;
  std::uint16_t* param_bf16 = nullptr;
  std::uint16_t* param_comp = nullptr;
  // How bf16 moments are rounded (kernels/stochastic_round.h). kStochastic needs state_dtype
  // kBFloat16 (fp32 moments are not rounded, 8-bit ones have their own rounding) and fp32 master
  // weights; the hash key is AdamHyper::rounding_seed and step, and rounding_index, the global
  // index of element 0 in the optimizer's flat state.
  MomentRounding moment_rounding = MomentRounding::kNearest;
  std::uint64_t rounding_index = 0;
};

// Instruction sets of the CPU implementation.
// kAvx512Bf16 is the AVX-512 variant that rounds to bf16 with VCVTNEPS2BF16 (AVX512_BF16) and
// kAvx512 the same without it (its bf16 roundings in integer operations); both give the same bits.
enum class CpuIsa : std::uint8_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };
// Every variant, narrowest first: where all of them are listed (supported sets, benchmarks,
// tests), so that a new one is listed once.
inline constexpr CpuIsa kCpuIsas[] = {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512,
                                      CpuIsa::kAvx512Bf16};

std::string_view isa_name(CpuIsa isa);
// Whether this CPU (and OS) can run `isa`: AVX2 needs AVX2, FMA and F16C; AVX-512 needs
// AVX-512 F, BW, VL and DQ; avx512bf16 AVX-512 and AVX512_BF16.
bool cpu_supports(CpuIsa isa);
// The widest supported instruction set.
CpuIsa best_cpu_isa();
// What the kernels use unless the caller forces one (CpuAdamOptions::force_isa): TIDE_CPU_ISA
// (auto, avx512bf16, avx512, avx2 or scalar; read once), auto meaning best_cpu_isa(). Throws
// config::EnvError naming TIDE_CPU_ISA for a value it does not accept or one this CPU cannot run.
CpuIsa default_cpu_isa();
// TIDE_CPU_ISA's rule over a given value and set of instruction sets (bit 1 << isa for each one
// supported): what default_cpu_isa() applies to the environment and this CPU.
CpuIsa choose_cpu_isa(std::string_view knob_value, unsigned supported);

struct CpuAdamOptions {
  // Threads to run on, 0 for all of the pool's (TIDE_CPU_THREADS, default: the CPUs this
  // process may run on). Small subgroups use fewer.
  unsigned threads = 0;
  // Use this instruction set instead of default_cpu_isa() (tests); must be supported.
  bool force_isa = false;
  CpuIsa isa = CpuIsa::kScalar;
  // Check every gradient before writing anything, and leave the whole subgroup untouched if one
  // is non-finite. Costs one extra read of the gradients.
  bool skip_subgroup_on_nonfinite = false;
};

struct AdamResult {
  // Elements left as they were because their gradient or update was not finite; with
  // skip_subgroup_on_nonfinite and applied == false, the number of non-finite gradients.
  std::uint64_t nonfinite = 0;
  // false when skip_subgroup_on_nonfinite found a non-finite gradient and nothing was written.
  bool applied = true;
};

// Validates the subgroup (dtypes, null pointers, alignment) and throws std::invalid_argument
// with a message naming the problem.
void validate(const AdamSubgroup& subgroup);

// One Adam/AdamW step over the subgroup.
AdamResult cpu_adam_step(const AdamSubgroup& subgroup, const AdamHyper& hyper,
                         const CpuAdamOptions& options = {});

// The number of non-finite values (NaN, ±inf) among `count` gradients of `dtype`.
std::uint64_t cpu_count_nonfinite(const void* grad, Dtype dtype, std::size_t count,
                                  const CpuAdamOptions& options = {});

// fp32 → bf16/fp16 with round-to-nearest-even, identical to kernels/dtype.h's conversions.
void cpu_cast(const float* src, void* dst, Dtype dst_dtype, std::size_t count,
              const CpuAdamOptions& options = {});

}  // namespace tide::kernels
