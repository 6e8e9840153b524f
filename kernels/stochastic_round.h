// Stochastic rounding of bf16 moments (MomentRounding::kStochastic), for host and device code.
//
// Round to nearest even is biased for a moment that changes by less than half a bf16 ulp per
// step: exp_avg_sq = β2·v + (1 − β2)·g² with β2 = 0.999 moves by about 0.1% of itself, a quarter
// of bf16's 2^-8 relative ulp, and nearest rounding throws that change away every step (the
// moment stalls). Stochastic rounding rounds up with probability equal to the fraction of an ulp
// the value lies above the bf16 value below it, so the stored moment is right on average:
//
//   bf16 = (bits(x) + r) >> 16     for r uniform in [0, 2^16), x finite or infinite;
//                                  NaN stays NaN, quieted, as float_to_bf16 does.
//
// Adding r to the bit pattern works on the magnitude for either sign, and a value that is
// already bf16 never moves. A value within an ulp of bf16's largest may round to infinity (as
// nearest rounding does within half an ulp); Adam then rejects that element's next update.
//
// r is not drawn from a stateful generator: it is a hash of (seed, step, the element's global
// index), so every implementation (scalar, AVX2, AVX-512, the CUDA kernel) and every split of
// the work (threads, chunks, subgroups, CPU or GPU) rounds each element the same way, and a
// resumed run with the same seed repeats the bits. The global index is the element's position
// in the optimizer's flat state (AdamSubgroup::rounding_index is that of the subgroup's element
// 0), which a different subgroup split does not change.
//
//   step_key = mix64(seed ^ mix64(step))                 once per step (rounding_step_key)
//   span_key = low 32 bits of mix64(step_key + (index >> 32))   once per 2^32 indices
//   h        = mix32(low 32 bits of index ^ span_key)    per element
//   exp_avg takes r = h & 0xffff, exp_avg_sq r = h >> 16.
//
// mix64 is SplitMix64's finalizer (Steele, Lea and Flood 2014) and mix32 MurmurHash3's fmix32
// (Appleby): bijective avalanche functions whose 32-bit form costs two integer multiplies a lane
// in the SIMD kernels. Consecutive indices of one span hash to unrelated values; the span key
// changes every step and with the seed.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/host_device.h"

namespace tide::kernels {

// How the bf16 moments are rounded after each update. fp32 moments need no rounding and 8-bit
// moments have their own (kernels/quant8.h): kStochastic is refused for them.
enum class MomentRounding : std::uint8_t { kNearest = 0, kStochastic = 1 };

TIDE_HOST_DEVICE std::uint64_t rounding_mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

TIDE_HOST_DEVICE std::uint32_t rounding_mix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  x ^= x >> 16;
  return x;
}

TIDE_HOST_DEVICE std::uint64_t rounding_step_key(std::uint64_t seed, std::int64_t step) {
  return rounding_mix64(seed ^ rounding_mix64(static_cast<std::uint64_t>(step)));
}

// The key of the 2^32 global indices that share `index`'s high half.
TIDE_HOST_DEVICE std::uint32_t rounding_span_key(std::uint64_t step_key, std::uint64_t index) {
  return static_cast<std::uint32_t>(rounding_mix64(step_key + (index >> 32)));
}

// 32 random bits of the element at global index `index` (its low half `index_low`).
TIDE_HOST_DEVICE std::uint32_t rounding_bits(std::uint32_t span_key, std::uint32_t index_low) {
  return rounding_mix32(index_low ^ span_key);
}

// fp32 → bf16 rounded up with probability (the fraction of an ulp above the bf16 value below):
// r is 16 random bits.
TIDE_HOST_DEVICE std::uint16_t float_to_bf16_stochastic(float f, std::uint32_t r) {
  const std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((u + r) >> 16);
}

}  // namespace tide::kernels
