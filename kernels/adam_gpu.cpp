#include "kernels/adam_gpu.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "driver/cuda_api.h"
#include "driver/error.h"
#include "driver/stream.h"
#include "kernels/fatbin.h"

namespace tide::kernels {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("tide: AdamGpu: " + message);
}

void require_aligned(CUdeviceptr p, unsigned bytes, const char* name, std::size_t index) {
  require(p != 0 && p % bytes == 0, std::string(name) + " of subgroup " + std::to_string(index) +
                                        " is null or not aligned to its element size");
}

// Enough blocks per row to keep every SM of a large GPU streaming, fewer for small subgroups;
// the kernel's loops stride over whatever remains.
constexpr std::uint64_t kMaxBlocksPerLaunch = 4096;

}  // namespace

AdamGpu::AdamGpu()
    : module_(fatbin_image()),
      kernel_(module_.function(kAdamKernel)),
      kernel_q8_(module_.function(kAdamQ8Kernel)) {}

driver::LaunchShape AdamGpu::shape(std::uint64_t max_count, unsigned rows) {
  const std::uint64_t per_block = std::uint64_t{kAdamBlockThreads} * kAdamVectorElements;
  const std::uint64_t wanted = std::max<std::uint64_t>(1, (max_count + per_block - 1) / per_block);
  const std::uint64_t cap = std::max<std::uint64_t>(1, kMaxBlocksPerLaunch / std::max(rows, 1u));
  driver::LaunchShape s;
  s.grid_x = static_cast<unsigned>(std::min(wanted, cap));
  s.grid_y = rows;
  s.block_x = kAdamBlockThreads;
  return s;
}

void AdamGpu::step(std::span<const AdamGpuSubgroup> subgroups, const AdamGpuDtypes& dtypes,
                   const AdamHyper& hyper, CUdeviceptr nonfinite,
                   const driver::Stream& stream) const {
  require(dtypes.grad == Dtype::kFloat32 || dtypes.grad == Dtype::kBFloat16 ||
              dtypes.grad == Dtype::kFloat16,
          "unknown gradient dtype");
  const bool quantized = dtypes.state_format == StateFormat::kBlockQ8;
  require(quantized || dtypes.state_format == StateFormat::kDtype, "unknown moment format");
  require(quantized || dtypes.state == Dtype::kFloat32 || dtypes.state == Dtype::kBFloat16,
          "moments must be fp32 or bf16");
  require(!dtypes.copy || *dtypes.copy == Dtype::kBFloat16 || *dtypes.copy == Dtype::kFloat16,
          "the weight copy must be bf16 or fp16");
  const bool bf16_master = dtypes.master == Dtype::kBFloat16;
  require(dtypes.master == Dtype::kFloat32 || bf16_master, "master weights must be fp32 or bf16");
  require(!bf16_master || (!quantized && !dtypes.copy),
          "bf16 master weights take no weight copy and no 8-bit moments");
  if (subgroups.empty()) return;
  require(nonfinite != 0 && nonfinite % 8 == 0, "null or misaligned counters");
  for (std::size_t i = 0; i < subgroups.size(); ++i) {
    const AdamGpuSubgroup& s = subgroups[i];
    if (s.count == 0) continue;
    require_aligned(s.grad, dtype_size(dtypes.grad), "grad", i);
    if (bf16_master) {
      require(s.param == 0, "subgroup " + std::to_string(i) +
                                ": bf16 master weights are in param_bf16 (param must be 0)");
      require_aligned(s.param_bf16, 2, "param_bf16", i);
      require_aligned(s.param_comp, 2, "param_comp", i);
    } else {
      require_aligned(s.param, 4, "param", i);
    }
    if (quantized) {
      // A block never straddles subgroups (kernels/quant8.h).
      for (const auto& [codes, name] :
           {std::pair{s.exp_avg, "exp_avg"}, std::pair{s.exp_avg_sq, "exp_avg_sq"}}) {
        require(codes != 0 && codes % kQuantBlock == 0,
                std::string("8-bit ") + name + " codes of subgroup " + std::to_string(i) +
                    " are null or do not start at a " + std::to_string(kQuantBlock) +
                    "-byte boundary: a subgroup of quantized moments must start at a multiple "
                    "of " +
                    std::to_string(kQuantBlock) + " elements (one quantization block)");
      }
      require_aligned(s.exp_avg_scale, 4, "exp_avg_scale", i);
      require_aligned(s.exp_avg_sq_scale, 4, "exp_avg_sq_scale", i);
    } else {
      require_aligned(s.exp_avg, dtype_size(dtypes.state), "exp_avg", i);
      require_aligned(s.exp_avg_sq, dtype_size(dtypes.state), "exp_avg_sq", i);
    }
    if (dtypes.copy) require_aligned(s.param_copy, 2, "param_copy", i);
  }

  AdamKernelParams p{};
  p.terms = adam_coefficients(hyper);
  p.grad_dtype = dtypes.grad;
  p.state_dtype = dtypes.state;
  p.has_copy = dtypes.copy ? 1 : 0;
  p.copy_dtype = dtypes.copy.value_or(Dtype::kBFloat16);
  p.state_format = dtypes.state_format;
  p.master_dtype = dtypes.master;
  TIDE_CU(cuMemsetD8Async, nonfinite, 0, subgroups.size() * sizeof(std::uint64_t), stream.get());
  for (std::size_t first = 0; first < subgroups.size(); first += kMaxAdamKernelSubgroups) {
    const auto rows = static_cast<unsigned>(
        std::min<std::size_t>(kMaxAdamKernelSubgroups, subgroups.size() - first));
    std::uint64_t max_count = 0;
    for (unsigned r = 0; r < rows; ++r) {
      const AdamGpuSubgroup& s = subgroups[first + r];
      // The kernel's one weight pointer: fp32 or, with bf16 master weights, bf16.
      const CUdeviceptr weights = bf16_master ? s.param_bf16 : s.param;
      p.subgroups[r] = {s.grad,  weights,         s.exp_avg,          s.exp_avg_sq, s.param_copy,
                        s.count, s.exp_avg_scale, s.exp_avg_sq_scale, s.param_comp};
      max_count = std::max(max_count, s.count);
    }
    p.subgroup_count = rows;
    p.nonfinite = nonfinite + first * sizeof(std::uint64_t);
    driver::launch(quantized ? kernel_q8_ : kernel_, shape(max_count, rows), stream, p);
  }
}

}  // namespace tide::kernels
