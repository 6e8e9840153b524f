// The AVX2 variant of the CPU implementation (AVX2 + FMA + F16C): 8 elements per step, tails
// with the scalar loop (which computes the same bits).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

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
  // A blend, not a branch or a ternary on vectors (which GCC does through the stack).
  static F8 select(bool c, F8 a, F8 b) {
    return {_mm256_blendv_ps(b.x, a.x, _mm256_castsi256_ps(_mm256_set1_epi32(c ? -1 : 0)))};
  }
};

AdamTerms<F8> broadcast(const AdamCoefficients& c) {
  return {F8{_mm256_set1_ps(c.grad_mul)},
          F8{_mm256_set1_ps(c.decay)},
          F8{_mm256_set1_ps(c.l2)},
          F8{_mm256_set1_ps(c.lerp_w)},
          F8{_mm256_set1_ps(c.beta2)},
          F8{_mm256_set1_ps(c.one_minus_beta2)},
          F8{_mm256_set1_ps(c.inv_bc2_sqrt)},
          F8{_mm256_set1_ps(c.eps)},
          F8{_mm256_set1_ps(c.neg_step_size)},
          c.lerp_from_grad};
}

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

__m128i to_fp16(__m256 x) {
  return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

template <Dtype D>
__m256 load(const void* base, std::size_t i) {
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

template <Dtype D>
void store(void* base, std::size_t i, __m256 x) {
  if constexpr (D == Dtype::kFloat32) {
    _mm256_storeu_ps(static_cast<float*>(base) + i, x);
  } else {
    const __m128i h = D == Dtype::kBFloat16 ? to_bf16(x) : to_fp16(x);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(base) + i), h);
  }
}

// x − x is 0 for a finite x and NaN otherwise: one ordered compare tests all three at once.
__m256 finite_mask(__m256 a, __m256 b, __m256 c) {
  const __m256 z =
      _mm256_add_ps(_mm256_add_ps(_mm256_sub_ps(a, a), _mm256_sub_ps(b, b)), _mm256_sub_ps(c, c));
  return _mm256_cmp_ps(z, z, _CMP_ORD_Q);
}

// Steps per burst: the main loop loads 8 vectors of each buffer in a row rather than one of
// each in turn (see cpu_avx512.cpp).
constexpr int kBurst = 8;

// kU vectors of 8 elements from element i. Returns how many were rejected as non-finite.
template <int kU, Dtype G, Dtype S, Dtype C>
unsigned step(const AdamTerms<F8>& t, const AdamSubgroup& s, std::size_t i) {
  __m256 g[kU], p[kU], m[kU], v[kU];
#pragma GCC unroll 8
  for (int u = 0; u < kU; ++u) g[u] = load<G>(s.grad, i + 8 * u);
#pragma GCC unroll 8
  for (int u = 0; u < kU; ++u) m[u] = load<S>(s.exp_avg, i + 8 * u);
#pragma GCC unroll 8
  for (int u = 0; u < kU; ++u) v[u] = load<S>(s.exp_avg_sq, i + 8 * u);
#pragma GCC unroll 8
  for (int u = 0; u < kU; ++u) p[u] = load<Dtype::kFloat32>(s.param, i + 8 * u);
  unsigned kept = 0;
#pragma GCC unroll 8
  for (int u = 0; u < kU; ++u) {
    F8 p1{p[u]}, m1{m[u]}, v1{v[u]};
    adam_update<Avx2Math>(t, F8{g[u]}, p1, m1, v1);
    const __m256 ok = finite_mask(p1.x, m1.x, v1.x);
    // Rejected lanes keep their old values: nothing non-finite is ever stored.
    p[u] = _mm256_blendv_ps(p[u], p1.x, ok);
    m[u] = _mm256_blendv_ps(m[u], m1.x, ok);
    v[u] = _mm256_blendv_ps(v[u], v1.x, ok);
    kept +=
        static_cast<unsigned>(__builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(ok))));
  }
#pragma GCC unroll 8
  for (int u = 0; u < kU; ++u) store<Dtype::kFloat32>(s.param, i + 8 * u, p[u]);
#pragma GCC unroll 8
  for (int u = 0; u < kU; ++u) store<S>(s.exp_avg, i + 8 * u, m[u]);
#pragma GCC unroll 8
  for (int u = 0; u < kU; ++u) store<S>(s.exp_avg_sq, i + 8 * u, v[u]);
  if constexpr (C != kNoCopy) {
    // The weight copy is written and not read: a streaming store saves the read a normal
    // store makes first. adam_range aligns it to 16 bytes.
#pragma GCC unroll 8
    for (int u = 0; u < kU; ++u) {
      auto* q = reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(s.param_copy) + i + 8 * u);
      _mm_stream_si128(q, C == Dtype::kBFloat16 ? to_bf16(p[u]) : to_fp16(p[u]));
    }
  }
  return 8u * kU - kept;
}

// flatten: adam_update (a header template, compiled for the baseline CPU) and the Avx2Math
// calls inside it are inlined here, into AVX2 code.
template <Dtype G, Dtype S, Dtype C>
[[gnu::flatten]] std::uint64_t adam_range(const AdamCoefficients& c, const AdamSubgroup& subgroup,
                                          std::size_t begin, std::size_t end) {
  // A local copy: the stores (through may-alias vector pointers) cannot touch it, so the
  // buffer addresses stay in registers instead of being reloaded every step.
  const AdamSubgroup s = subgroup;
  const AdamTerms<F8> t = broadcast(c);
  std::uint64_t rejected = 0;
  std::size_t i = begin;
  if constexpr (C != kNoCopy) {
    // Scalar steps up to the copy's first 16-byte boundary, for the streaming stores.
    const auto address =
        reinterpret_cast<std::uintptr_t>(static_cast<std::uint16_t*>(s.param_copy) + i);
    const std::size_t head = std::min<std::size_t>((16 - address % 16) % 16 / 2, end - i);
    rejected += adam_scalar_range<G, S, C>(c, s, i, i + head);
    i += head;
  }
  for (; i + 8 * kBurst <= end; i += 8 * kBurst) rejected += step<kBurst, G, S, C>(t, s, i);
  for (; i + 8 <= end; i += 8) rejected += step<1, G, S, C>(t, s, i);
  // Streaming stores are weakly ordered: fence them before the caller hands the copy on.
  if constexpr (C != kNoCopy) _mm_sfence();
  return rejected + adam_scalar_range<G, S, C>(c, s, i, end);
}

std::uint64_t adam(const AdamCoefficients& t, const AdamSubgroup& s, std::size_t begin,
                   std::size_t end) {
  return dispatch_dtypes(s, [&](auto g, auto st, auto c) {
    return adam_range<decltype(g)::value, decltype(st)::value, decltype(c)::value>(t, s, begin,
                                                                                   end);
  });
}

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

void cast(const float* src, void* dst, Dtype dst_dtype, std::size_t begin, std::size_t end) {
  auto* out = static_cast<std::uint16_t*>(dst);
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 x = _mm256_loadu_ps(src + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     dst_dtype == Dtype::kFloat16 ? to_fp16(x) : to_bf16(x));
  }
  scalar_kernels().cast(src, dst, dst_dtype, i, end);
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
  static constexpr CpuKernels kKernels{CpuIsa::kAvx2, &adam, &count_nonfinite, &cast};
  return kKernels;
}

}  // namespace tide::kernels
