// The device's fp16/bf16 conversions as NVIDIA's CUDA toolkit implements them for host code
// (cuda_fp16.hpp, cuda_bf16.hpp: the branch compiled when not on the device). Compiled in a
// translation unit of its own (nvidia_reference.cpp): the toolkit's headers and tide's
// CUDA-on-host header define the same names.
#pragma once

#include <cstdint>

namespace tide::kernels::testing {

float nvidia_half2float(std::uint16_t bits);
std::uint16_t nvidia_float2half_rn(float value);
std::uint16_t nvidia_float2bfloat16_rn(float value);

}  // namespace tide::kernels::testing
