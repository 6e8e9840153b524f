// <cuda_fp16.h> for kernels compiled on the host (kernels/host/cuda_emulation.h): only this
// directory is on their include path, never the CUDA toolkit's. The part of the device's fp16 API
// tide's kernels use, with the device's results bit for bit; tests/kernels/host_cuda_test.cpp
// checks every 16-bit pattern against the toolkit's own host implementation (cuda_fp16.hpp).
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

struct __half {
  unsigned short __x;
};

inline __half __ushort_as_half(unsigned short bits) { return __half{bits}; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }

// Exact for every number (fp32 holds every fp16 value). A NaN becomes the canonical fp32 NaN
// 0x7fffffff, payload and sign dropped, as the device's cvt.f32.f16 does.
inline float __half2float(__half h) {
  if ((h.__x & 0x7c00u) == 0x7c00u && (h.__x & 0x03ffu) != 0) {
    return tide::kernels::bits_float(0x7fffffffu);
  }
  return tide::kernels::fp16_to_float(h.__x);
}
