// fp32 → bf16/fp16 copy; element math shared with the CPU path (kernels/cast.h).
#include "kernels/cast.h"

using tide::kernels::CastParams;

extern "C" __global__ void tide_cast_f32_to_half(CastParams p) {
  const auto* src = reinterpret_cast<const float*>(p.src);
  auto* dst = reinterpret_cast<std::uint16_t*>(p.dst);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < p.count; i += stride) {
    dst[i] = tide::kernels::cast_element(src[i], p.dst_dtype);
  }
}
