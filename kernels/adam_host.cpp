// kernels/cuda/adam.cu compiled for the host (kernels/host/cuda.h): the stand-in driver runs this,
// the kernel's own source, for a launch of tide_adam_step.
#include "kernels/host/cuda.h"
// Second: the kernel source sees the host definitions of CUDA's keywords and intrinsics.
#include "kernels/cuda/adam.cu"
#include "kernels/host_kernel.h"

namespace tide::kernels {

extern const HostKernelEntry kAdamHostKernel{kAdamKernel, &host::kernel_thread<&tide_adam_step>,
                                             sizeof(AdamKernelParams)};

}  // namespace tide::kernels
