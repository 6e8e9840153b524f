// Kernels that kernels/host/cuda_emulation.h must refuse to compile (tests/kernels/CMakeLists.txt
// compiles this file once per -DREFUSE_* and expects the header's message).
#include "kernels/host/cuda_emulation.h"

#if defined(REFUSE_syncthreads)
__global__ void uses_a_barrier(unsigned* out) {
  out[threadIdx.x] = threadIdx.x;
  __syncthreads();
}
#endif

#if defined(REFUSE_shared)
__global__ void uses_shared_memory(unsigned* out) {
  __shared__ unsigned staging[32];
  staging[threadIdx.x % 32] = threadIdx.x;
  out[threadIdx.x] = staging[0];
}
#endif
