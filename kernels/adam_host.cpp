// Host twin of kernels/cuda/adam.cu: the stand-in driver runs it for a launch of
// tide_adam_step. It steps each subgroup of the launch with the CPU implementation on the
// calling (stream) thread, with the instruction set the CPU kernels use (default_cpu_isa()): the
// same bits as the kernel.
#include <cstring>
#include <exception>

#include "kernels/adam_kernel.h"
#include "kernels/cpu_variant.h"
#include "kernels/host_kernel.h"

namespace tide::kernels {
namespace {

// The twin runs on a stream's thread, where nothing may throw: a TIDE_CPU_ISA the kernels refuse
// is reported by the CPU kernels' own calls, and the twin uses the widest set (the same bits).
CpuIsa twin_isa() noexcept {
  try {
    return default_cpu_isa();
  } catch (const std::exception&) {
    return best_cpu_isa();
  }
}

}  // namespace

void adam_host(const HostGrid& grid, void** params) {
  AdamKernelParams p;
  std::memcpy(&p, params[0], sizeof p);
  const CpuKernels& cpu = cpu_kernels(twin_isa());
  // Grid rows past subgroup_count return at once in the kernel, and rows past the grid never run.
  const unsigned rows = p.subgroup_count < grid.grid[1] ? p.subgroup_count : grid.grid[1];
  for (unsigned row = 0; row < rows; ++row) {
    const AdamKernelSubgroup& d = p.subgroups[row];
    AdamSubgroup s;
    s.grad = reinterpret_cast<const void*>(d.grad);
    s.param = reinterpret_cast<float*>(d.param);
    s.exp_avg = reinterpret_cast<void*>(d.exp_avg);
    s.exp_avg_sq = reinterpret_cast<void*>(d.exp_avg_sq);
    s.param_copy = p.has_copy ? reinterpret_cast<void*>(d.param_copy) : nullptr;
    s.count = d.count;
    s.grad_dtype = p.grad_dtype;
    s.state_dtype = p.state_dtype;
    s.copy_dtype = p.copy_dtype;
    const std::uint64_t rejected = cpu.adam(p.terms, s, 0, s.count);
    reinterpret_cast<unsigned long long*>(p.nonfinite)[row] += rejected;
  }
}

}  // namespace tide::kernels
