#include "tests/kernels/nvidia_reference.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace tide::kernels::testing {

float nvidia_half2float(std::uint16_t bits) { return __half2float(__ushort_as_half(bits)); }

std::uint16_t nvidia_float2half_rn(float value) { return __half_as_ushort(__float2half_rn(value)); }

std::uint16_t nvidia_float2bfloat16_rn(float value) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(value));
}

}  // namespace tide::kernels::testing
