// Low-precision floating-point formats and their conversions, for host and device code.
//
// Values travel as raw 16-bit patterns (uint16_t) so that host code needs no compiler support
// for bf16/fp16. Conversions from fp32 round to nearest, ties to even, as PyTorch's casts do;
// NaN stays NaN (quiet), infinities stay infinite.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace tide::kernels {

enum class Dtype : std::uint8_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

TIDE_HOST_DEVICE std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

TIDE_HOST_DEVICE float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TIDE_HOST_DEVICE float bf16_to_float(std::uint16_t h) {
  return bits_float(static_cast<std::uint32_t>(h) << 16);
}

TIDE_HOST_DEVICE std::uint16_t float_to_bf16(float f) {
  const std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  const std::uint32_t round = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + round) >> 16);
}

TIDE_HOST_DEVICE float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf/NaN
  if (exponent != 0) return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return bits_float(sign);  // signed zero
  // Subnormal half: normalise into a float.
  std::uint32_t e = 113;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --e;
  }
  return bits_float(sign | (e << 23) | ((mantissa & 0x3ffu) << 13));
}

TIDE_HOST_DEVICE std::uint16_t float_to_fp16(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): scale the significand into half's subnormal range, with
    // round-to-nearest-even on the bits shifted out.
    if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // below half of min subnormal
    const std::uint32_t exponent = abs >> 23;
    const std::uint32_t significand = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exponent;  // 14..24
    std::uint32_t half = significand >> shift;
    const std::uint32_t rest = significand & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
  const std::uint32_t rebiased = abs - (112u << 23);
  const std::uint32_t round = 0xfffu + ((rebiased >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((rebiased + round) >> 13));
}

TIDE_HOST_DEVICE constexpr unsigned dtype_size(Dtype dtype) {
  return dtype == Dtype::kFloat32 ? 4u : 2u;
}

// Storage type and conversions of each dtype, for code templated on the dtype.
template <Dtype D>
struct DtypeTraits;

template <>
struct DtypeTraits<Dtype::kFloat32> {
  using Storage = float;
  static TIDE_HOST_DEVICE float to_float(float x) { return x; }
  static TIDE_HOST_DEVICE float from_float(float x) { return x; }
};

template <>
struct DtypeTraits<Dtype::kBFloat16> {
  using Storage = std::uint16_t;
  static TIDE_HOST_DEVICE float to_float(std::uint16_t x) { return bf16_to_float(x); }
  static TIDE_HOST_DEVICE std::uint16_t from_float(float x) { return float_to_bf16(x); }
};

template <>
struct DtypeTraits<Dtype::kFloat16> {
  using Storage = std::uint16_t;
  static TIDE_HOST_DEVICE float to_float(std::uint16_t x) { return fp16_to_float(x); }
  static TIDE_HOST_DEVICE std::uint16_t from_float(float x) { return float_to_fp16(x); }
};

}  // namespace tide::kernels
