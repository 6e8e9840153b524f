// The AVX2 variant of the CPU implementation (AVX2 + FMA + F16C): 8 elements per step, tails
// with the scalar loop (which computes the same bits).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu_quant8.h"
#include "kernels/cpu_simd.h"
#include "kernels/cpu_variant.h"

// Everything below is compiled for AVX2 (see cpu_variant.h for why this is a region after the
// #includes and not a per-file flag).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,popcnt"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,popcnt")
#endif

namespace tide::kernels {
namespace {

// __m256 wrapped in a struct: vector types lose their attributes as template arguments.
struct F8 {
  __m256 x;
};

struct Avx2Math {
  static F8 fma(F8 a, F8 b, F8 c) { return {_mm256_fmadd_ps(a.x, b.x, c.x)}; }
  static F8 mul(F8 a, F8 b) { return {_mm256_mul_ps(a.x, b.x)}; }
  static F8 add(F8 a, F8 b) { return {_mm256_add_ps(a.x, b.x)}; }
  static F8 sub(F8 a, F8 b) { return {_mm256_sub_ps(a.x, b.x)}; }
  static F8 div(F8 a, F8 b) { return {_mm256_div_ps(a.x, b.x)}; }
  static F8 sqrt(F8 a) { return {_mm256_sqrt_ps(a.x)}; }
  static F8 min(F8 a, F8 b) { return {_mm256_min_ps(a.x, b.x)}; }  // a < b ? a : b
  static F8 max(F8 a, F8 b) { return {_mm256_max_ps(a.x, b.x)}; }  // a > b ? a : b
  // A blend, not a branch or a ternary on vectors (which GCC does through the stack).
  static F8 select(bool c, F8 a, F8 b) {
    return {_mm256_blendv_ps(b.x, a.x, _mm256_castsi256_ps(_mm256_set1_epi32(c ? -1 : 0)))};
  }
};

// fp32 → bf16, round to nearest even; NaN stays NaN, quieted (kernels/dtype.h's float_to_bf16).
__m128i to_bf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i high = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
  // Every lane is below 0x10000, so the unsigned saturating pack is exact.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// fp32 → bf16 rounded by adding r (16 random bits a lane) before truncating: kernels/
// stochastic_round.h's float_to_bf16_stochastic.
__m128i to_bf16_rounded(__m256 x, __m256i r) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, r), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i b = _mm256_blendv_epi8(rounded, quiet, nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
}

__m128i to_fp16(__m256 x) {
  return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// The vector traits of kernels/cpu_simd.h: 8 lanes; heads and tails take the scalar loop.
struct Avx2 : SimdShape<F8, Avx2Math, /*kMasked=*/false> {
  static F8 splat(float x) { return {_mm256_set1_ps(x)}; }
  static void fence() { _mm_sfence(); }

  template <Dtype D, bool kTail>
  static __m256 load(const void* base, std::size_t i, Lanes /*k*/) {
    static_assert(!kTail);
    if constexpr (D == Dtype::kFloat32) {
      return _mm256_loadu_ps(static_cast<const float*>(base) + i);
    } else {
      const __m128i h = _mm_loadu_si128(
          reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(base) + i));
      if constexpr (D == Dtype::kBFloat16) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      }
      return _mm256_cvtph_ps(h);
    }
  }

  template <Dtype D, bool kTail>
  static void store(void* base, std::size_t i, Lanes /*k*/, __m256 x) {
    static_assert(!kTail);
    if constexpr (D == Dtype::kFloat32) {
      _mm256_storeu_ps(static_cast<float*>(base) + i, x);
    } else {
      const __m128i h = D == Dtype::kBFloat16 ? to_bf16(x) : to_fp16(x);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(base) + i), h);
    }
  }

  template <Dtype D>
  static void stream(void* base, std::size_t i, __m256 x) {
    auto* q = reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(base) + i);
    _mm_stream_si128(q, D == Dtype::kBFloat16 ? to_bf16(x) : to_fp16(x));
  }

  // Stochastic rounding (kernels/stochastic_round.h): rounding_mix32 on 8 lanes.
  using Bits = __m256i;
  static __m256i rounding_bits(std::uint32_t key, std::uint32_t first) {
    __m256i x = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(first)),
                                 _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    x = _mm256_xor_si256(x, _mm256_set1_epi32(static_cast<int>(key)));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x85ebca6bu)));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 13));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0xc2b2ae35u)));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  }
  static __m256i low16(__m256i h) { return _mm256_and_si256(h, _mm256_set1_epi32(0xffff)); }
  static __m256i high16(__m256i h) { return _mm256_srli_epi32(h, 16); }
  template <bool kTail>
  static void store_bf16_rounded(void* base, std::size_t i, Lanes /*k*/, __m256 x, __m256i r) {
    static_assert(!kTail);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(base) + i),
                     to_bf16_rounded(x, r));
  }

  // 8-bit moments (kernels/cpu_simd.h): the code maps and the buckets by 32-bit gathers from L1.
  template <bool kSigned, bool kTail>
  static __m256 q8_values(const std::uint8_t* codes, std::size_t i, Lanes /*k*/, __m256 scale) {
    static_assert(!kTail);
    const __m256i c =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
    if constexpr (kSigned) {
      const __m256i magnitude = _mm256_and_si256(c, _mm256_set1_epi32(0x7f));
      const __m256 x = _mm256_mul_ps(_mm256_i32gather_ps(kQ8SignedMagnitudes, magnitude, 4), scale);
      // Bit 7 of the code is the sign: negation, as the scalar code's.
      const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
      return _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(x), sign));
    } else {
      return _mm256_mul_ps(_mm256_i32gather_ps(kQ8UnsignedValues, c, 4), scale);
    }
  }

  template <bool kSigned, bool kTail>
  static void q8_store(void* codes, std::size_t i, Lanes /*k*/, __m256 x, __m256 pre, __m256 inv,
                       const Q8SearchTable& table) {
    static_assert(!kTail);
    const __m256 y = _mm256_mul_ps(_mm256_mul_ps(x, pre), inv);
    // |y| for exp_avg; for exp_avg_sq, y clamped at +0 (the scalar rule gives every y <= 0 code 0;
    // maxps returns its second operand for two zeros, so −0 becomes +0).
    const __m256 a = kSigned ? _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(y),
                                                                    _mm256_set1_epi32(0x7fffffff)))
                             : _mm256_max_ps(y, _mm256_setzero_ps());
    __m256i key = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(a), kQ8BucketShift),
                                   _mm256_set1_epi32(kQ8FirstBucketKey));
    key = _mm256_min_epi32(_mm256_max_epi32(key, _mm256_setzero_si256()),
                           _mm256_set1_epi32(kQ8Buckets - 1));
    const __m256i entry = _mm256_i32gather_epi32(reinterpret_cast<const int*>(table.bucket),
                                                 _mm256_add_epi32(key, _mm256_slli_epi32(key, 1)),
                                                 1);  // 3 · key: kQ8BucketEntryBytes
    const __m256i low16 = _mm256_set1_epi32(0xffff);
    const __m256i base = _mm256_and_si256(_mm256_srli_epi32(entry, 16), _mm256_set1_epi32(0xff));
    const __m256i above = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(a), low16),
                                             _mm256_and_si256(entry, low16));
    // The compare's all-ones lanes are −1: subtracting adds 1 where y is above the midpoint.
    __m256i code = _mm256_sub_epi32(base, above);
    if constexpr (kSigned) {
      const __m256i negative = _mm256_andnot_si256(
          _mm256_cmpeq_epi32(code, _mm256_setzero_si256()),
          _mm256_castps_si256(_mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_LT_OQ)));
      code = _mm256_or_si256(code, _mm256_and_si256(negative, _mm256_set1_epi32(0x80)));
    }
    // The low byte of each 32-bit lane: four per 128-bit half, then the halves side by side.
    const __m256i picked = _mm256_shuffle_epi8(
        code, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8,
                               12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
    const __m128i bytes =
        _mm_unpacklo_epi32(_mm256_castsi256_si128(picked), _mm256_extracti128_si256(picked, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(static_cast<std::uint8_t*>(codes) + i), bytes);
  }

  static __m256 max_abs(__m256 a, Lanes /*k*/, __m256 x) {
    const __m256 magnitude = _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fffffff)));
    return _mm256_max_ps(a, magnitude);
  }
  static float hmax(__m256 a) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
  }

  // x − x is 0 for a finite x and NaN otherwise: one ordered compare tests all three at once.
  static unsigned keep_finite(F8 p1, F8 m1, F8 v1, Lanes /*k*/, __m256& p, __m256& m, __m256& v) {
    const __m256 z =
        _mm256_add_ps(_mm256_add_ps(_mm256_sub_ps(p1.x, p1.x), _mm256_sub_ps(m1.x, m1.x)),
                      _mm256_sub_ps(v1.x, v1.x));
    const __m256 ok = _mm256_cmp_ps(z, z, _CMP_ORD_Q);
    p = _mm256_blendv_ps(p, p1.x, ok);
    m = _mm256_blendv_ps(m, m1.x, ok);
    v = _mm256_blendv_ps(v, v1.x, ok);
    return 8u -
           static_cast<unsigned>(__builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(ok))));
  }
};

// flatten: the loops of cpu_simd.h and adam_update (header templates, compiled for the baseline
// CPU) and the Avx2Math calls inside them are inlined here, into AVX2 code.
struct AdamRange {
  template <Dtype G, Dtype S, Dtype C>
  [[gnu::flatten]] static std::uint64_t run(const AdamCoefficients& c, const AdamSubgroup& s,
                                            std::size_t begin, std::size_t end) {
    return simd_adam_range<Avx2, G, S, C>(c, s, begin, end);
  }
  template <Dtype G, Dtype C>
  [[gnu::flatten]] static std::uint64_t run_sr(const AdamCoefficients& c, const AdamSubgroup& s,
                                               std::size_t begin, std::size_t end,
                                               std::uint32_t span_key) {
    return simd_adam_range<Avx2, G, Dtype::kBFloat16, C, true>(c, s, begin, end, span_key);
  }
  template <Dtype G, Dtype C>
  [[gnu::flatten]] static std::uint64_t run_q8(const AdamCoefficients& c, const AdamSubgroup& s,
                                               std::size_t begin, std::size_t end) {
    return simd_adam_q8_range<Avx2, G, C>(c, s, begin, end);
  }
};

std::uint64_t count_nonfinite(const void* values, Dtype dtype, std::size_t begin, std::size_t end) {
  std::uint64_t n = 0;
  std::size_t i = begin;
  if (dtype == Dtype::kFloat32) {
    const auto* x = static_cast<const std::uint32_t*>(values);
    const __m256i exponent = _mm256_set1_epi32(0x7f800000);
    for (; i + 8 <= end; i += 8) {
      const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
      const __m256i hit = _mm256_cmpeq_epi32(_mm256_and_si256(u, exponent), exponent);
      n += static_cast<unsigned>(
          __builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(hit)))));
    }
    return n + scalar_kernels().count_nonfinite(values, dtype, i, end);
  }
  const auto* x = static_cast<const std::uint16_t*>(values);
  const __m256i exponent =
      _mm256_set1_epi16(static_cast<short>(dtype == Dtype::kBFloat16 ? 0x7f80 : 0x7c00));
  for (; i + 16 <= end; i += 16) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i hit = _mm256_cmpeq_epi16(_mm256_and_si256(u, exponent), exponent);
    // movemask_epi8 gives two bits per 16-bit lane.
    n += static_cast<unsigned>(
             __builtin_popcount(static_cast<unsigned>(_mm256_movemask_epi8(hit)))) /
         2;
  }
  return n + scalar_kernels().count_nonfinite(values, dtype, i, end);
}

[[gnu::flatten]] void cast(const float* src, void* dst, Dtype dst_dtype, std::size_t begin,
                           std::size_t end) {
  simd_cast<Avx2>(src, dst, dst_dtype, begin, end);
}

}  // namespace
}  // namespace tide::kernels

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace tide::kernels {

const CpuKernels& avx2_kernels() {
  static constexpr CpuKernels kKernels{CpuIsa::kAvx2, &adam_for_dtypes<AdamRange>, &count_nonfinite,
                                       &cast};
  return kKernels;
}

}  // namespace tide::kernels
