// Runs a kernel compiled for the host (kernels/host/cuda_emulation.h) over a launch's grid: every
// block, every thread, on the calling OS thread.
//
// Blocks run one after another. Within a block, each warp of 32 threads (by linear thread index,
// as on the device) runs its threads as fibers (kernels/host/fiber.h), one at a time, each until
// it returns or reaches a warp collective; once every thread of the warp has returned or waits,
// the waiting collectives complete (each sees every thread its mask names) and their threads run
// on. A collective whose named threads do not all arrive with the same mask is a KernelFault, as
// is a thread that names itself out of the mask or names threads the warp does not have: on the
// device these hang or return undefined values.
#pragma once

#include <stdexcept>

#include "kernels/host_kernel.h"

namespace tide::kernels::host {

// A launch that would fault, hang or compute undefined values on the device. The message names
// the block and thread.
class KernelFault : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Runs `thread` (kernel_thread<kernel> of kernels/host/cuda_emulation.h) as every thread of `grid`,
// with `params` as the kernel's parameters. Throws KernelFault; the runner stays usable after one.
void run_grid(const HostGrid& grid, KernelThread thread, const void* params);

}  // namespace tide::kernels::host
