// kernels/cuda/adam.cu compiled for the host (kernels/host/cuda_emulation.h): the stand-in driver
// runs this, the kernel's own source, for a launch of tide_adam_step or tide_adam_step_q8.
#include "kernels/host/cuda_emulation.h"
// Second: the kernel source sees the host definitions of CUDA's keywords and intrinsics.
#include "kernels/cuda/adam.cu"
#include "kernels/host_kernel.h"

namespace tide::kernels {
namespace {

// Each grid row that has a subgroup reads and writes its buffers, and its counter.
std::vector<KernelRange> adam_ranges(const HostGrid& grid, const void* params) {
  const auto& p = *static_cast<const AdamKernelParams*>(params);
  const std::uint32_t rows = p.subgroup_count < grid.grid[1] ? p.subgroup_count : grid.grid[1];
  std::vector<KernelRange> out;
  out.push_back({p.nonfinite, std::uint64_t{rows} * sizeof(unsigned long long), true});
  for (std::uint32_t r = 0; r < rows && r < kMaxAdamKernelSubgroups; ++r) {
    const AdamKernelSubgroup& s = p.subgroups[r];
    out.push_back({s.grad, s.count * dtype_size(p.grad_dtype), false});
    const bool bf16_master = p.master_dtype == Dtype::kBFloat16;
    out.push_back({s.param, s.count * (bf16_master ? 2 : 4), true});
    if (bf16_master) out.push_back({s.param_comp, s.count * 2, true});
    if (p.state_format == StateFormat::kBlockQ8) {
      out.push_back({s.exp_avg, s.count, true});
      out.push_back({s.exp_avg_sq, s.count, true});
      out.push_back({s.exp_avg_scale, quant_blocks(s.count) * 4, true});
      out.push_back({s.exp_avg_sq_scale, quant_blocks(s.count) * 4, true});
    } else {
      out.push_back({s.exp_avg, s.count * dtype_size(p.state_dtype), true});
      out.push_back({s.exp_avg_sq, s.count * dtype_size(p.state_dtype), true});
    }
    if (p.has_copy) out.push_back({s.param_copy, s.count * 2, true});
  }
  return out;
}

}  // namespace

extern const HostKernelEntry kAdamHostKernel{kAdamKernel, &host::kernel_thread<&tide_adam_step>,
                                             sizeof(AdamKernelParams), &adam_ranges};
extern const HostKernelEntry kAdamQ8HostKernel{kAdamQ8Kernel,
                                               &host::kernel_thread<&tide_adam_step_q8>,
                                               sizeof(AdamKernelParams), &adam_ranges};

}  // namespace tide::kernels
