// kernels/cuda/cast.cu compiled for the host (kernels/host/cuda_emulation.h): the stand-in driver
// runs this, the kernel's own source, for a launch of tide_cast_f32_to_half.
#include "kernels/host/cuda_emulation.h"
// Second: the kernel source sees the host definitions of CUDA's keywords and intrinsics.
#include "kernels/cuda/cast.cu"
#include "kernels/host_kernel.h"

namespace tide::kernels {
namespace {

std::vector<KernelRange> cast_ranges(const HostGrid& /*grid*/, const void* params) {
  const auto& p = *static_cast<const CastParams*>(params);
  return {{p.src, p.count * 4, false}, {p.dst, p.count * 2, true}};
}

}  // namespace

extern const HostKernelEntry kCastHostKernel{
    kCastKernel, &host::kernel_thread<&tide_cast_f32_to_half>, sizeof(CastParams), &cast_ranges};

}  // namespace tide::kernels
