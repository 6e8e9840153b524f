// The cast kernel: fp32 values to a low-precision copy (bf16 or fp16), e.g. the master weights
// of a GPU subgroup into the model's parameters.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace tide::kernels {

struct CastParams {
  std::uint64_t src;  // const float*: device address (CUdeviceptr)
  std::uint64_t dst;  // uint16_t*: device address
  std::uint64_t count;
  Dtype dst_dtype;  // kBFloat16 or kFloat16
};

inline constexpr const char* kCastKernel = "tide_cast_f32_to_half";

TIDE_HOST_DEVICE std::uint16_t cast_element(float value, Dtype dtype) {
  return dtype == Dtype::kFloat16 ? float_to_fp16(value) : float_to_bf16(value);
}

}  // namespace tide::kernels
