// The AVX-512 variant of the CPU implementation: 16 elements per step, tails with masked loads
// and stores (so any length and any alignment take the same code). Its bf16 roundings to nearest
// even are done with integer operations, so that they round exactly as kernels/dtype.h does.
// cpu_avx512_bf16.cpp compiles this file once more with TIDE_AVX512_BF16 set, for CPUs with
// AVX512_BF16: there VCVTNEPS2BF16 rounds, and the integer operations take only the vectors it
// would round differently (to_bf16).
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <utility>

#include "kernels/cpu_quant8.h"
#include "kernels/cpu_simd.h"
#include "kernels/cpu_variant.h"

#ifndef TIDE_AVX512_BF16
#define TIDE_AVX512_BF16 0
#endif

// Everything below is compiled for AVX-512 (see cpu_variant.h for why this is a region after
// the #includes and not a per-file flag), with AVX512_BF16 in cpu_avx512_bf16.cpp's copy only.
#if defined(__clang__) && TIDE_AVX512_BF16
#pragma clang attribute push(                                                                      \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c,popcnt"))), \
    apply_to = function)
#elif defined(__clang__)
#pragma clang attribute push(                                                           \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,popcnt"))), \
    apply_to = function)
#elif TIDE_AVX512_BF16
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c,popcnt")
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,popcnt")
#endif

namespace tide::kernels {
namespace {

// __m512 wrapped in a struct: vector types lose their attributes as template arguments.
struct F16 {
  __m512 x;
};

struct Avx512Math {
  static F16 fma(F16 a, F16 b, F16 c) { return {_mm512_fmadd_ps(a.x, b.x, c.x)}; }
  static F16 mul(F16 a, F16 b) { return {_mm512_mul_ps(a.x, b.x)}; }
  static F16 add(F16 a, F16 b) { return {_mm512_add_ps(a.x, b.x)}; }
  static F16 sub(F16 a, F16 b) { return {_mm512_sub_ps(a.x, b.x)}; }
  static F16 div(F16 a, F16 b) { return {_mm512_div_ps(a.x, b.x)}; }
  static F16 sqrt(F16 a) { return {_mm512_sqrt_ps(a.x)}; }
  static F16 min(F16 a, F16 b) { return {_mm512_min_ps(a.x, b.x)}; }  // a < b ? a : b
  static F16 max(F16 a, F16 b) { return {_mm512_max_ps(a.x, b.x)}; }  // a > b ? a : b
  // A blend, not a branch or a ternary on vectors (which GCC does through the stack).
  static F16 select(bool c, F16 a, F16 b) {
    return {_mm512_mask_blend_ps(static_cast<__mmask16>(c ? 0xffff : 0), b.x, a.x)};
  }
};

// fp32 → bf16, round to nearest even; NaN stays NaN, quieted (kernels/dtype.h's float_to_bf16).
__m256i to_bf16(__m512 x) {
#if TIDE_AVX512_BF16
  // VCVTNEPS2BF16 rounds normal numbers (those that round to infinity included) and infinities
  // exactly so, but flushes denormal inputs to zero. NaNs also take the integer operations: the
  // manual gives them the same bits, but checking for them here costs nothing more. One such lane
  // sends the whole vector there: rare (a moment decaying through the denormals), and one
  // branch on a mask is cheaper than merging both results every time.
  constexpr int kNotByInstruction = 0x01 | 0x20 | 0x80;  // fpclass: QNaN, denormal, SNaN
  if (_mm512_fpclass_ps_mask(x, kNotByInstruction) == 0) [[likely]] {
    return std::bit_cast<__m256i>(_mm512_cvtneps_pbh(x));
  }
#endif
  const __m512i u = _mm512_castps_si512(x);
  const __m512i high = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// fp32 → bf16 rounded by adding r (16 random bits a lane) before truncating: kernels/
// stochastic_round.h's float_to_bf16_stochastic.
__m256i to_bf16_rounded(__m512 x, __m512i r) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, r), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// fp32 → fp16 with the immediate round-to-nearest-even mode, whatever MXCSR says.
__m256i to_fp16(__m512 x) {
  return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

__m512 from_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The vector traits of kernels/cpu_simd.h: 16 lanes, masked heads and tails.
struct Avx512 : SimdShape<F16, Avx512Math, /*kMasked=*/true, __mmask16, 0xffff> {
  static Lanes first_lanes(std::size_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
  static F16 splat(float x) { return {_mm512_set1_ps(x)}; }
  static void fence() { _mm_sfence(); }

  template <Dtype D, bool kTail>
  static __m512 load(const void* base, std::size_t i, Lanes k) {
    if constexpr (D == Dtype::kFloat32) {
      const float* p = static_cast<const float*>(base) + i;
      return kTail ? _mm512_maskz_loadu_ps(k, p) : _mm512_loadu_ps(p);
    } else {
      const auto* p = static_cast<const std::uint16_t*>(base) + i;
      const __m256i h = kTail ? _mm256_maskz_loadu_epi16(k, p)
                              : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      if constexpr (D == Dtype::kBFloat16) return from_bf16(h);
      return _mm512_cvtph_ps(h);
    }
  }

  template <Dtype D, bool kTail>
  static void store(void* base, std::size_t i, Lanes k, __m512 x) {
    if constexpr (D == Dtype::kFloat32) {
      float* p = static_cast<float*>(base) + i;
      if constexpr (kTail) {
        _mm512_mask_storeu_ps(p, k, x);
      } else {
        _mm512_storeu_ps(p, x);
      }
    } else {
      auto* p = static_cast<std::uint16_t*>(base) + i;
      const __m256i h = D == Dtype::kBFloat16 ? to_bf16(x) : to_fp16(x);
      if constexpr (kTail) {
        _mm256_mask_storeu_epi16(p, k, h);
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
      }
    }
  }

  template <Dtype D>
  static void stream(void* base, std::size_t i, __m512 x) {
    auto* q = reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(base) + i);
    _mm256_stream_si256(q, D == Dtype::kBFloat16 ? to_bf16(x) : to_fp16(x));
  }

  // Stochastic rounding (kernels/stochastic_round.h): rounding_mix32 on 16 lanes.
  using Bits = __m512i;
  static __m512i rounding_bits(std::uint32_t key, std::uint32_t first) {
    __m512i x =
        _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(first)),
                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    x = _mm512_xor_si512(x, _mm512_set1_epi32(static_cast<int>(key)));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x85ebca6bu)));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 13));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0xc2b2ae35u)));
    return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  }
  static __m512i low16(__m512i h) { return _mm512_and_si512(h, _mm512_set1_epi32(0xffff)); }
  static __m512i high16(__m512i h) { return _mm512_srli_epi32(h, 16); }
  template <bool kTail>
  static void store_bf16_rounded(void* base, std::size_t i, Lanes k, __m512 x, __m512i r) {
    auto* p = static_cast<std::uint16_t*>(base) + i;
    const __m256i h = to_bf16_rounded(x, r);
    if constexpr (kTail) {
      _mm256_mask_storeu_epi16(p, k, h);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
    }
  }

  // table[index] for a table of 32·kPairs floats, in registers: vpermi2ps picks from each pair
  // of 16-float registers (32 entries) by the index's low 5 bits, then its bits 5 and up pick the
  // pair by blends. Instead of a 16-lane gather, which costs more than the permutes on the
  // CPUs measured (bench_cpu_adam_q8).
  template <unsigned kPairs>
  static __m512 lookup(const float* table, __m512i index) {
    __m512 r[kPairs];
    for (unsigned j = 0; j < kPairs; ++j) {
      r[j] = _mm512_permutex2var_ps(_mm512_loadu_ps(table + 32 * j), index,
                                    _mm512_loadu_ps(table + 32 * j + 16));
    }
    for (unsigned width = 1, bit = 5; width < kPairs; width *= 2, ++bit) {
      const __mmask16 high = _mm512_test_epi32_mask(index, _mm512_set1_epi32(1 << bit));
      for (unsigned j = 0; j + width < kPairs; j += 2 * width) {
        r[j] = _mm512_mask_blend_ps(high, r[j], r[j + width]);
      }
    }
    return r[0];
  }

  // The number of the map's midpoints strictly below a: kernels/quant8.h's q8_count_below, the
  // same compares in the same order, each step's pivot picked by permutes from
  // Q8SearchTable::pivot.
  template <unsigned kSteps>
  static __m512i count_below(const Q8SearchTable& table, __m512 a) {
    __m512i code = _mm512_setzero_si512();
    [&]<unsigned... kL>(std::integer_sequence<unsigned, kL...>) {
      (
          [&] {
            const __m512i j = _mm512_srli_epi32(code, kSteps - kL);
            __m512 pivot;
            if constexpr (kL == 0) {
              pivot = _mm512_set1_ps(table.pivot[0][0]);
            } else if constexpr (kL <= 4) {
              pivot = _mm512_permutexvar_ps(j, _mm512_loadu_ps(table.pivot[kL]));
            } else {
              pivot = lookup<(1u << kL) / 32>(table.pivot[kL], j);
            }
            const __mmask16 above = _mm512_cmp_ps_mask(a, pivot, _CMP_GT_OQ);
            code =
                _mm512_mask_add_epi32(code, above, code, _mm512_set1_epi32(1 << (kSteps - 1 - kL)));
          }(),
          ...);
    }
    (std::make_integer_sequence<unsigned, kSteps>{});
    return code;
  }

  // 8-bit moments (kernels/cpu_simd.h). The step is bound by the vector ALU ports (two for
  // 512-bit operations), not by memory: permutes occupy them, gathers mostly the load ports. So
  // exp_avg takes permutes (its 128-entry map, 7 search steps) and exp_avg_sq gathers (its
  // 256-entry map costs twice the permutes). Measured on the development Xeon (bench_cpu_adam_q8,
  // one thread, cache-resident) against permute decodes with gather encodes: 1.34x; gathers
  // everywhere 0.87x; permutes everywhere 0.96x.
  template <bool kSigned, bool kTail>
  static __m512 q8_values(const std::uint8_t* codes, std::size_t i, Lanes k, __m512 scale) {
    const __m128i bytes = kTail ? _mm_maskz_loadu_epi8(k, codes + i)
                                : _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
    const __m512i c = _mm512_cvtepu8_epi32(bytes);
    if constexpr (kSigned) {
      const __m512i magnitude = _mm512_and_si512(c, _mm512_set1_epi32(0x7f));
      const __m512 x = _mm512_mul_ps(lookup<4>(kQ8SignedMagnitudes, magnitude), scale);
      // Bit 7 of the code is the sign: negation, as the scalar code's.
      const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24);
      return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), sign));
    } else {
      return _mm512_mul_ps(_mm512_i32gather_ps(c, kQ8UnsignedValues, 4), scale);
    }
  }

  template <bool kSigned, bool kTail>
  static void q8_store(void* codes, std::size_t i, Lanes k, __m512 x, __m512 pre, __m512 inv,
                       const Q8SearchTable& table) {
    const __m512 y = _mm512_mul_ps(_mm512_mul_ps(x, pre), inv);
    // |y| for exp_avg; for exp_avg_sq, y clamped at +0 (the scalar rule gives every y <= 0 code 0).
    const __m512 a = kSigned ? _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(y),
                                                                    _mm512_set1_epi32(0x7fffffff)))
                             : _mm512_max_ps(y, _mm512_setzero_ps());
    __m512i code;
    if constexpr (kSigned) {
      code = count_below<7>(table, a);
    } else {
      const __m512i key = _mm512_min_epi32(
          _mm512_max_epi32(
              _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(a), kQ8BucketShift),
                               _mm512_set1_epi32(kQ8FirstBucketKey)),
              _mm512_setzero_si512()),
          _mm512_set1_epi32(kQ8Buckets - 1));
      const __m512i entry = _mm512_i32gather_epi32(_mm512_add_epi32(key, _mm512_slli_epi32(key, 1)),
                                                   table.bucket, 1);  // 3 · key
      const __m512i low16 = _mm512_set1_epi32(0xffff);
      const __m512i base = _mm512_and_si512(_mm512_srli_epi32(entry, 16), _mm512_set1_epi32(0xff));
      const __mmask16 above = _mm512_cmpgt_epi32_mask(
          _mm512_and_si512(_mm512_castps_si512(a), low16), _mm512_and_si512(entry, low16));
      code = _mm512_mask_add_epi32(base, above, base, _mm512_set1_epi32(1));
    }
    if constexpr (kSigned) {
      const __mmask16 negative = _mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_LT_OQ) &
                                 _mm512_test_epi32_mask(code, code);
      code = _mm512_mask_or_epi32(code, negative, code, _mm512_set1_epi32(0x80));
    }
    const __m128i bytes = _mm512_cvtepi32_epi8(code);
    auto* p = static_cast<std::uint8_t*>(codes) + i;
    if constexpr (kTail) {
      _mm_mask_storeu_epi8(p, k, bytes);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bytes);
    }
  }

  static __m512 max_abs(__m512 a, Lanes k, __m512 x) {
    const __m512 magnitude = _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
    return _mm512_mask_max_ps(a, k, a, magnitude);
  }
  static float hmax(__m512 a) { return _mm512_reduce_max_ps(a); }

  static unsigned keep_finite(F16 p1, F16 m1, F16 v1, Lanes k, __m512& p, __m512& m, __m512& v) {
    constexpr int kNonFinite = 0x01 | 0x08 | 0x10 | 0x80;  // fpclass: QNaN, +inf, -inf, SNaN
    const auto bad = static_cast<__mmask16>((_mm512_fpclass_ps_mask(p1.x, kNonFinite) |
                                             _mm512_fpclass_ps_mask(m1.x, kNonFinite) |
                                             _mm512_fpclass_ps_mask(v1.x, kNonFinite)) &
                                            k);
    p = _mm512_mask_blend_ps(bad, p1.x, p);
    m = _mm512_mask_blend_ps(bad, m1.x, m);
    v = _mm512_mask_blend_ps(bad, v1.x, v);
    return static_cast<unsigned>(__builtin_popcount(bad));
  }
};

// flatten: the loops of cpu_simd.h and adam_update (header templates, compiled for the baseline
// CPU) and the Avx512Math calls inside them are inlined here, into AVX-512 code.
struct AdamRange {
  template <Dtype G, Dtype S, Dtype C>
  [[gnu::flatten]] static std::uint64_t run(const AdamCoefficients& c, const AdamSubgroup& s,
                                            std::size_t begin, std::size_t end) {
    return simd_adam_range<Avx512, G, S, C>(c, s, begin, end);
  }
  template <Dtype G, Dtype C>
  [[gnu::flatten]] static std::uint64_t run_sr(const AdamCoefficients& c, const AdamSubgroup& s,
                                               std::size_t begin, std::size_t end,
                                               std::uint32_t span_key) {
    return simd_adam_range<Avx512, G, Dtype::kBFloat16, C, true>(c, s, begin, end, span_key);
  }
  template <Dtype G, Dtype C>
  [[gnu::flatten]] static std::uint64_t run_q8(const AdamCoefficients& c, const AdamSubgroup& s,
                                               std::size_t begin, std::size_t end) {
    return simd_adam_q8_range<Avx512, G, C>(c, s, begin, end);
  }
};

// Non-finite: exponent bits all ones. 32 16-bit values or 16 fp32 values per step.
std::uint64_t count_nonfinite(const void* values, Dtype dtype, std::size_t begin, std::size_t end) {
  std::uint64_t n = 0;
  std::size_t i = begin;
  if (dtype == Dtype::kFloat32) {
    const auto* x = static_cast<const float*>(values);
    const __m512i exponent = _mm512_set1_epi32(0x7f800000);
    for (; i < end; i += 16) {
      const auto k = static_cast<__mmask16>(end - i >= 16 ? 0xffffu : (1u << (end - i)) - 1u);
      const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(k, x + i));
      n += static_cast<unsigned>(
          __builtin_popcount(_mm512_cmpeq_epi32_mask(_mm512_and_si512(u, exponent), exponent)));
    }
    return n;
  }
  const auto* x = static_cast<const std::uint16_t*>(values);
  const __m512i exponent =
      _mm512_set1_epi16(static_cast<short>(dtype == Dtype::kBFloat16 ? 0x7f80 : 0x7c00));
  for (; i < end; i += 32) {
    const __mmask32 k = end - i >= 32 ? 0xffffffffu : (1u << (end - i)) - 1u;
    const __m512i u = _mm512_maskz_loadu_epi16(k, x + i);
    n += static_cast<unsigned>(
        __builtin_popcount(_mm512_cmpeq_epi16_mask(_mm512_and_si512(u, exponent), exponent)));
  }
  return n;
}

[[gnu::flatten]] void cast(const float* src, void* dst, Dtype dst_dtype, std::size_t begin,
                           std::size_t end) {
  simd_cast<Avx512>(src, dst, dst_dtype, begin, end);
}

}  // namespace
}  // namespace tide::kernels

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace tide::kernels {

#if TIDE_AVX512_BF16
const CpuKernels& avx512_bf16_kernels() {
  static constexpr CpuKernels kKernels{CpuIsa::kAvx512Bf16, &adam_for_dtypes<AdamRange>,
                                       &count_nonfinite, &cast};
  return kKernels;
}
#else
const CpuKernels& avx512_kernels() {
  static constexpr CpuKernels kKernels{CpuIsa::kAvx512, &adam_for_dtypes<AdamRange>,
                                       &count_nonfinite, &cast};
  return kKernels;
}
#endif

}  // namespace tide::kernels
