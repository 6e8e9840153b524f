// The loops of the SIMD variants of the CPU implementation (cpu_avx2.cpp, cpu_avx512.cpp), written
// once over the vector width: each variant defines a vector traits type V (below) for its
// instruction set and instantiates these templates with it.
//
// V is declared in the variant's anonymous namespace, inside its `#pragma GCC target` region, so
// that every instantiation here is local to that file (the linker cannot swap in another
// variant's copy) and V's functions are compiled for the variant's instruction set. The variant's
// entry points are [[gnu::flatten]]: these templates, compiled for the baseline CPU like
// adam_update (adam_math.h), are inlined into them, into the variant's own code.
//
// V derives from SimdShape (its vector types) and provides:
//   first_lanes(n)              with masked tails: the mask of the first n lanes (n < kWidth)
//   splat(x)                    x in every lane
//   load<D, kTail>(p, i, k)     kWidth values of dtype D from element i of p as fp32 (kTail:
//                               the lanes in k only, the others zero and never touched)
//   store<D, kTail>(p, i, k, x) the same, stored as dtype D
//   stream<D>(p, i, x)          a streaming store as dtype D to a 2 * kWidth-byte-aligned address
//   keep_finite(p1, m1, v1, k, p, m, v)  p, m, v become p1, m1, v1 in the lanes (of k) where all
//                               three are finite, and keep their old values elsewhere; returns
//                               how many lanes kept their old values
//   fence()                     orders the streaming stores before what follows
// and, for stochastically rounded bf16 moments (kernels/stochastic_round.h), with Bits an
// integer register of kWidth 32-bit lanes:
//   rounding_bits(key, first)   lane j: rounding_bits(key, first + j)
//   low16(h), high16(h)         each lane's low and high 16 bits
//   store_bf16_rounded<kTail>(p, i, k, x, r)  x as bf16 rounded up by adding r (16 bits a lane)
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/adam_math.h"
#include "kernels/cpu_adam.h"
#include "kernels/cpu_quant8.h"
#include "kernels/cpu_variant.h"
#include "kernels/dtype.h"

namespace tide::kernels {

// A variant's vectors: Wide, the fp32 register (Reg) wrapped in a struct as its member x, which
// adam_update runs on with Math (adam_math.h); kWidth lanes. With kMasked, the instruction set
// loads and stores masked lanes (a Lanes mask, kAll for all of them): heads and tails are one
// masked step; otherwise they run the scalar loop, which computes the same bits.
template <typename WideT, typename MathT, bool kMasked, typename LanesT = int,
          LanesT kAllLanes = LanesT{}>
struct SimdShape {
  using Wide = WideT;
  using Reg = decltype(WideT::x);
  using Math = MathT;
  using Lanes = LanesT;
  static constexpr std::size_t kWidth = sizeof(Reg) / sizeof(float);
  static constexpr bool kMaskedTails = kMasked;
  static constexpr Lanes kAll = kAllLanes;
};

// Steps per burst: the main loop loads 8 vectors (8 cache lines with AVX-512) of each buffer in a
// row, as DeepSpeed's kernel does, rather than one vector of each buffer in turn. Measured on the
// development machine (Xeon, 2 threads, 1e8 parameters, AVX-512): about 9% more bandwidth than
// one vector per step; 16 gained nothing more.
inline constexpr int kSimdBurst = 8;

// The coefficients, in every lane.
template <typename V>
AdamTerms<typename V::Wide> simd_broadcast(const AdamCoefficients& c) {
  return {V::splat(c.grad_mul),
          V::splat(c.decay),
          V::splat(c.l2),
          V::splat(c.lerp_w),
          V::splat(c.beta2),
          V::splat(c.one_minus_beta2),
          V::splat(c.inv_bc2_sqrt),
          V::splat(c.eps),
          V::splat(c.neg_step_size),
          V::splat(c.m_bound),
          V::splat(c.neg_m_bound),
          c.lerp_from_grad,
          c.rounding_key};
}

// kU vectors from element i (kTail: one vector, the lanes in k). Returns how many elements were
// rejected as non-finite. kSr: bf16 moments rounded stochastically with span_key's bits.
template <typename V, int kU, Dtype G, Dtype S, Dtype C, bool kTail, bool kSr = false>
unsigned simd_adam_step(const AdamTerms<typename V::Wide>& t, const AdamSubgroup& s, std::size_t i,
                        typename V::Lanes k, std::uint32_t span_key = 0) {
  static_assert(!kTail || kU == 1);
  static_assert(!kSr || S == Dtype::kBFloat16);
  using Reg = typename V::Reg;
  using Wide = typename V::Wide;
  constexpr std::size_t kW = V::kWidth;
  Reg g[kU], p[kU], m[kU], v[kU];
#pragma GCC unroll 8
  for (int u = 0; u < kU; ++u) g[u] = V::template load<G, kTail>(s.grad, i + kW * u, k);
#pragma GCC unroll 8
  for (int u = 0; u < kU; ++u) m[u] = V::template load<S, kTail>(s.exp_avg, i + kW * u, k);
#pragma GCC unroll 8
  for (int u = 0; u < kU; ++u) v[u] = V::template load<S, kTail>(s.exp_avg_sq, i + kW * u, k);
#pragma GCC unroll 8
  for (int u = 0; u < kU; ++u) {
    p[u] = V::template load<Dtype::kFloat32, kTail>(s.param, i + kW * u, k);
  }
  unsigned rejected = 0;
#pragma GCC unroll 8
  for (int u = 0; u < kU; ++u) {
    Wide p1{p[u]}, m1{m[u]}, v1{v[u]};
    adam_update<typename V::Math>(t, Wide{g[u]}, p1, m1, v1);
    // Rejected lanes keep their old values: nothing non-finite is ever stored.
    rejected += V::keep_finite(p1, m1, v1, k, p[u], m[u], v[u]);
  }
#pragma GCC unroll 8
  for (int u = 0; u < kU; ++u) {
    V::template store<Dtype::kFloat32, kTail>(s.param, i + kW * u, k, p[u]);
  }
  if constexpr (kSr) {
#pragma GCC unroll 8
    for (int u = 0; u < kU; ++u) {
      const auto h =
          V::rounding_bits(span_key, static_cast<std::uint32_t>(s.rounding_index + i + kW * u));
      V::template store_bf16_rounded<kTail>(s.exp_avg, i + kW * u, k, m[u], V::low16(h));
      V::template store_bf16_rounded<kTail>(s.exp_avg_sq, i + kW * u, k, v[u], V::high16(h));
    }
  } else {
#pragma GCC unroll 8
    for (int u = 0; u < kU; ++u) V::template store<S, kTail>(s.exp_avg, i + kW * u, k, m[u]);
#pragma GCC unroll 8
    for (int u = 0; u < kU; ++u) V::template store<S, kTail>(s.exp_avg_sq, i + kW * u, k, v[u]);
  }
  if constexpr (C != kNoCopy) {
    // The weight copy is written and not read: a streaming store of its full lines saves the read
    // a normal store makes first (2 of 30 bytes per element).
#pragma GCC unroll 8
    for (int u = 0; u < kU; ++u) {
      if constexpr (kTail) {
        V::template store<C, true>(s.param_copy, i, k, p[u]);
      } else {
        V::template stream<C>(s.param_copy, i + kW * u, p[u]);
      }
    }
  }
  return rejected;
}

// Elements [i, end), fewer than a vector's: one masked step, or the scalar loop.
template <typename V, Dtype G, Dtype S, Dtype C, bool kSr>
std::uint64_t simd_adam_part(const AdamCoefficients& c, const AdamTerms<typename V::Wide>& t,
                             const AdamSubgroup& s, std::size_t i, std::size_t end,
                             std::uint32_t span_key) {
  if constexpr (V::kMaskedTails) {
    return i < end ? simd_adam_step<V, 1, G, S, C, true, kSr>(t, s, i, V::first_lanes(end - i),
                                                              span_key)
                   : 0;
  } else {
    return adam_scalar_range<G, S, C, kSr>(c, s, i, end, span_key);
  }
}

// bf16 master weights (adam_master_element): one vector from element i. The bf16 roundings of
// the new weight and of its remainder go through a stack line (store as bf16, load back), the
// variant's own conversion, which equals float_to_bf16. The compensation follows the decision
// keep_finite takes on the weight and moments: z is +0 where they are all finite and NaN where
// not, and c1 − z is c1 (signs of zeros included) or NaN, which keep_finite then rejects.
template <typename V, Dtype G, Dtype S, bool kTail>
unsigned simd_master_step(const AdamTerms<typename V::Wide>& t, const AdamSubgroup& s,
                          std::size_t i, typename V::Lanes k) {
  using Reg = typename V::Reg;
  using Wide = typename V::Wide;
  using M = typename V::Math;
  constexpr Dtype kB = Dtype::kBFloat16;
  alignas(64) std::uint16_t rounded[V::kWidth];
  const Reg g = V::template load<G, kTail>(s.grad, i, k);
  Reg w = V::template load<kB, kTail>(s.param_bf16, i, k);
  Reg c = V::template load<kB, kTail>(s.param_comp, i, k);
  Reg m = V::template load<S, kTail>(s.exp_avg, i, k);
  Reg v = V::template load<S, kTail>(s.exp_avg_sq, i, k);
  Wide p1 = M::add(Wide{w}, Wide{c}), m1{m}, v1{v};
  adam_update<M>(t, Wide{g}, p1, m1, v1);
  V::template store<kB, kTail>(rounded, 0, k, p1.x);
  const Wide w1{V::template load<kB, kTail>(rounded, 0, k)};
  V::template store<kB, kTail>(rounded, 0, k, M::sub(p1, w1).x);
  const Wide c1{V::template load<kB, kTail>(rounded, 0, k)};
  const Wide z = M::add(M::add(M::sub(w1, w1), M::sub(m1, m1)), M::sub(v1, v1));
  const Wide c2 = M::sub(c1, z);
  const unsigned rejected = V::keep_finite(w1, m1, v1, k, w, m, v);
  Reg unused_m = c, unused_v = c;
  V::keep_finite(c2, c2, c2, k, c, unused_m, unused_v);
  V::template store<kB, kTail>(s.param_bf16, i, k, w);
  V::template store<kB, kTail>(s.param_comp, i, k, c);
  V::template store<S, kTail>(s.exp_avg, i, k, m);
  V::template store<S, kTail>(s.exp_avg_sq, i, k, v);
  return rejected;
}

template <typename V, Dtype G, Dtype S>
std::uint64_t simd_master_range(const AdamCoefficients& c, const AdamSubgroup& subgroup,
                                std::size_t begin, std::size_t end) {
  constexpr std::size_t kW = V::kWidth;
  const AdamSubgroup s = subgroup;
  const AdamTerms<typename V::Wide> t = simd_broadcast<V>(c);
  std::uint64_t rejected = 0;
  std::size_t i = begin;
  for (; i + kW <= end; i += kW) rejected += simd_master_step<V, G, S, false>(t, s, i, V::kAll);
  if (i == end) return rejected;
  if constexpr (V::kMaskedTails) {
    return rejected + simd_master_step<V, G, S, true>(t, s, i, V::first_lanes(end - i));
  } else {
    return rejected + adam_scalar_range<G, S, kNoCopy>(c, s, i, end);
  }
}

// kSr: [begin, end) within one span of stochastic rounding (kernels/cpu_variant.h).
template <typename V, Dtype G, Dtype S, Dtype C, bool kSr = false>
std::uint64_t simd_adam_range(const AdamCoefficients& c, const AdamSubgroup& subgroup,
                              std::size_t begin, std::size_t end, std::uint32_t span_key = 0) {
  if constexpr (C == kNoCopy && !kSr) {
    if (subgroup.master_dtype == Dtype::kBFloat16) {
      return simd_master_range<V, G, S>(c, subgroup, begin, end);
    }
  }
  constexpr std::size_t kW = V::kWidth;
  // A local copy: the stores (through may-alias vector pointers) cannot touch it, so the
  // buffer addresses stay in registers instead of being reloaded every step.
  const AdamSubgroup s = subgroup;
  const AdamTerms<typename V::Wide> t = simd_broadcast<V>(c);
  std::uint64_t rejected = 0;
  std::size_t i = begin;
  if constexpr (C != kNoCopy) {
    // Up to the copy's first boundary of one vector's 16-bit values, for the streaming stores.
    constexpr std::size_t kAlign = 2 * kW;
    const auto address =
        reinterpret_cast<std::uintptr_t>(static_cast<std::uint16_t*>(s.param_copy) + i);
    const std::size_t head =
        std::min<std::size_t>((kAlign - address % kAlign) % kAlign / 2, end - i);
    rejected += simd_adam_part<V, G, S, C, kSr>(c, t, s, i, i + head, span_key);
    i += head;
  }
  for (; i + kW * kSimdBurst <= end; i += kW * kSimdBurst) {
    rejected += simd_adam_step<V, kSimdBurst, G, S, C, false, kSr>(t, s, i, V::kAll, span_key);
  }
  for (; i + kW <= end; i += kW) {
    rejected += simd_adam_step<V, 1, G, S, C, false, kSr>(t, s, i, V::kAll, span_key);
  }
  // Streaming stores are weakly ordered: fence them before the caller hands the copy on.
  if constexpr (C != kNoCopy) V::fence();
  return rejected + simd_adam_part<V, G, S, C, kSr>(c, t, s, i, end, span_key);
}

// 8-bit moments (kernels/cpu_quant8.h), one quantization block at a time: a vector pass that
// dequantizes, updates and keeps the new moments in `block` with their running absmax, then one
// that requantizes. V provides, beyond the above:
//   q8_values<kSigned, kTail>(codes, i, k, scale)    the dequantized moments at element i
//   q8_store<kSigned, kTail>(codes, i, k, x, pre, inv, table)  x's codes stored at element i
//   max_abs(a, k, x)                                 lane-wise max of a and |x| (lanes of k)
//   hmax(a)                                          the maximum of a's lanes
// Without masked tails, a block's last elements take the scalar loop (the same bits).
template <typename V, Dtype G, Dtype C>
std::uint64_t simd_adam_q8_range(const AdamCoefficients& c, const AdamSubgroup& subgroup,
                                 std::size_t begin, std::size_t end) {
  using Reg = typename V::Reg;
  using Wide = typename V::Wide;
  constexpr std::size_t kW = V::kWidth;
  const AdamSubgroup s = subgroup;
  const AdamTerms<Wide> t = simd_broadcast<V>(c);
  const auto* cm = static_cast<std::uint8_t*>(s.exp_avg);
  const auto* cv = static_cast<std::uint8_t*>(s.exp_avg_sq);
  std::uint64_t rejected = 0;
  Q8Block block;
  for (std::size_t first = begin; first < end; first += kQuantBlock) {
    const std::size_t last = std::min(end, first + kQuantBlock);
    const Reg scale_m = V::splat(s.exp_avg_scale[first / kQuantBlock]).x;
    const Reg scale_v = V::splat(s.exp_avg_sq_scale[first / kQuantBlock]).x;
    Reg absmax_m = V::splat(0.0f).x, absmax_v = absmax_m;
    auto update = [&]<bool kTail>(std::size_t i, typename V::Lanes k) {
      const Reg g = V::template load<G, kTail>(s.grad, i, k);
      Reg p = V::template load<Dtype::kFloat32, kTail>(s.param, i, k);
      Reg m = V::template q8_values<true, kTail>(cm, i, k, scale_m);
      Reg v = V::template q8_values<false, kTail>(cv, i, k, scale_v);
      Wide p1{p}, m1{m}, v1{v};
      adam_update<typename V::Math, true>(t, Wide{g}, p1, m1, v1);
      rejected += V::keep_finite(p1, m1, v1, k, p, m, v);
      V::template store<Dtype::kFloat32, kTail>(s.param, i, k, p);
      if constexpr (C != kNoCopy) V::template store<C, kTail>(s.param_copy, i, k, p);
      V::template store<Dtype::kFloat32, kTail>(block.m, i - first, k, m);
      V::template store<Dtype::kFloat32, kTail>(block.v, i - first, k, v);
      absmax_m = V::max_abs(absmax_m, k, m);
      absmax_v = V::max_abs(absmax_v, k, v);
    };
    std::size_t i = first;
    for (; i + kW <= last; i += kW) update.template operator()<false>(i, V::kAll);
    block.absmax_m = block.absmax_v = 0.0f;
    if (i < last) {
      if constexpr (V::kMaskedTails) {
        update.template operator()<true>(i, V::first_lanes(last - i));
      } else {
        rejected += q8_update_scalar<G, C>(c, s, first, i, last, block);
      }
    }
    block.absmax_m = std::max(block.absmax_m, V::hmax(absmax_m));
    block.absmax_v = std::max(block.absmax_v, V::hmax(absmax_v));
    if (!q8_scales_finite(s, first)) continue;
    const Q8Normalizer nm = q8_normalizer<HostMath>(block.absmax_m);
    const Q8Normalizer nv = q8_normalizer<HostMath>(block.absmax_v);
    const Reg pre_m = V::splat(nm.pre).x, inv_m = V::splat(nm.inv).x;
    const Reg pre_v = V::splat(nv.pre).x, inv_v = V::splat(nv.inv).x;
    auto quantize = [&]<bool kTail>(std::size_t j, typename V::Lanes k) {
      const Reg m = V::template load<Dtype::kFloat32, kTail>(block.m, j - first, k);
      const Reg v = V::template load<Dtype::kFloat32, kTail>(block.v, j - first, k);
      V::template q8_store<true, kTail>(s.exp_avg, j, k, m, pre_m, inv_m, kQ8SearchExpAvg);
      V::template q8_store<false, kTail>(s.exp_avg_sq, j, k, v, pre_v, inv_v, kQ8SearchExpAvgSq);
    };
    std::size_t j = first;
    for (; j + kW <= last; j += kW) quantize.template operator()<false>(j, V::kAll);
    if (j < last) {
      if constexpr (V::kMaskedTails) {
        quantize.template operator()<true>(j, V::first_lanes(last - j));
      } else {
        q8_quantize_scalar(s, first, j, last, block);
      }
    }
    q8_store_scales(s, first, block);
  }
  return rejected;
}

// fp32 to the 16-bit dtype D, element by element.
template <typename V, Dtype D>
void simd_cast_range(const float* src, void* dst, std::size_t begin, std::size_t end) {
  constexpr std::size_t kW = V::kWidth;
  std::size_t i = begin;
  for (; i + kW <= end; i += kW) {
    V::template store<D, false>(dst, i, V::kAll,
                                V::template load<Dtype::kFloat32, false>(src, i, V::kAll));
  }
  if (i == end) return;
  if constexpr (V::kMaskedTails) {
    const auto k = V::first_lanes(end - i);
    V::template store<D, true>(dst, i, k, V::template load<Dtype::kFloat32, true>(src, i, k));
  } else {
    scalar_kernels().cast(src, dst, D, i, end);
  }
}

template <typename V>
void simd_cast(const float* src, void* dst, Dtype dst_dtype, std::size_t begin, std::size_t end) {
  if (dst_dtype == Dtype::kFloat16) {
    simd_cast_range<V, Dtype::kFloat16>(src, dst, begin, end);
  } else {
    simd_cast_range<V, Dtype::kBFloat16>(src, dst, begin, end);
  }
}

}  // namespace tide::kernels
