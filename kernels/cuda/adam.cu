// The fused Adam/AdamW step over one or many flat subgroups. The element math is
// kernels/adam_math.h's, with DeviceMath (every operation rounded once, as on the CPU), and the
// casts are kernels/dtype.h's: the kernel's outputs are bit for bit the CPU path's.
//
// Each thread steps 8 elements at a time with 16-byte loads and stores, once every buffer of
// the subgroup is at a common 8-element boundary; the elements before it (the head), after the
// last full step (the tail), and whole subgroups whose buffers are not mutually aligned go one
// element at a time. With 8-bit moments (kernels/quant8.h) each warp steps whole quantization
// blocks instead (adam_q8_subgroup).
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/adam_kernel.h"
#include "kernels/adam_math.h"
#include "kernels/dtype.h"
#include "kernels/quant8.h"
#include "kernels/stochastic_round.h"

namespace tide::kernels {
namespace {

using u16 = std::uint16_t;

// fp16 → fp32 in hardware: exact, like fp16_to_float, without its loop for subnormals.
template <Dtype D>
__device__ __forceinline__ float load_one(const void* base, std::uint64_t i) {
  if constexpr (D == Dtype::kFloat32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (D == Dtype::kBFloat16) {
    return bf16_to_float(static_cast<const u16*>(base)[i]);
  } else {
    return __half2float(__ushort_as_half(static_cast<const u16*>(base)[i]));
  }
}

template <Dtype D>
__device__ __forceinline__ float half_to_float(unsigned bits) {
  if constexpr (D == Dtype::kBFloat16) return bits_float(bits << 16);
  return __half2float(__ushort_as_half(static_cast<u16>(bits)));
}

// Eight consecutive values from element i (a multiple of 8 on the vector path).
template <Dtype D>
__device__ __forceinline__ void load8(const void* base, std::uint64_t i, float (&x)[8]) {
  if constexpr (D == Dtype::kFloat32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
    const float4 a = p[0], b = p[1];
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
    x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
    const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const u16*>(base) + i);
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      x[2 * k] = half_to_float<D>(w[k] & 0xffffu);
      x[2 * k + 1] = half_to_float<D>(w[k] >> 16);
    }
  }
}

template <Dtype D>
__device__ __forceinline__ void store8(void* base, std::uint64_t i, const float (&x)[8]) {
  if constexpr (D == Dtype::kFloat32) {
    float4* p = reinterpret_cast<float4*>(static_cast<float*>(base) + i);
    p[0] = make_float4(x[0], x[1], x[2], x[3]);
    p[1] = make_float4(x[4], x[5], x[6], x[7]);
  } else {
    unsigned w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[k] = static_cast<unsigned>(DtypeTraits<D>::from_float(x[2 * k])) |
             (static_cast<unsigned>(DtypeTraits<D>::from_float(x[2 * k + 1])) << 16);
    }
    *reinterpret_cast<uint4*>(static_cast<u16*>(base) + i) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Stochastic rounding of bf16 moments (kernels/stochastic_round.h): element i's 32 random bits.
__device__ __forceinline__ std::uint32_t moment_bits(const AdamCoefficients& t,
                                                     const AdamKernelSubgroup& s, std::uint64_t i) {
  const std::uint64_t index = s.rounding_index + i;
  return rounding_bits(rounding_span_key(t.rounding_key, index), static_cast<std::uint32_t>(index));
}

// Eight bf16 moments from element i, rounded with bits[e]'s low (exp_avg) or high half.
__device__ __forceinline__ void store8_rounded(void* base, std::uint64_t i, const float (&x)[8],
                                               const std::uint32_t (&bits)[8], bool high) {
  unsigned w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const std::uint32_t r0 = high ? bits[2 * k] >> 16 : bits[2 * k] & 0xffffu;
    const std::uint32_t r1 = high ? bits[2 * k + 1] >> 16 : bits[2 * k + 1] & 0xffffu;
    w[k] = static_cast<unsigned>(float_to_bf16_stochastic(x[2 * k], r0)) |
           (static_cast<unsigned>(float_to_bf16_stochastic(x[2 * k + 1], r1)) << 16);
  }
  *reinterpret_cast<uint4*>(static_cast<u16*>(base) + i) = make_uint4(w[0], w[1], w[2], w[3]);
}

// One element, for heads, tails and unaligned subgroups. Returns 1 if rejected. stochastic:
// bf16 moments rounded stochastically.
template <Dtype G, Dtype S, Dtype C>
__device__ __forceinline__ unsigned step1(const AdamCoefficients& t, const AdamKernelSubgroup& s,
                                          std::uint64_t i, bool stochastic) {
  float p = reinterpret_cast<const float*>(s.param)[i];
  float m = load_one<S>(reinterpret_cast<const void*>(s.exp_avg), i);
  float v = load_one<S>(reinterpret_cast<const void*>(s.exp_avg_sq), i);
  const float g = load_one<G>(reinterpret_cast<const void*>(s.grad), i);
  const bool ok = adam_element<DeviceMath>(t, g, p, m, v);
  reinterpret_cast<float*>(s.param)[i] = p;
  if (S == Dtype::kBFloat16 && stochastic) {
    const std::uint32_t h = moment_bits(t, s, i);
    reinterpret_cast<u16*>(s.exp_avg)[i] = float_to_bf16_stochastic(m, h & 0xffffu);
    reinterpret_cast<u16*>(s.exp_avg_sq)[i] = float_to_bf16_stochastic(v, h >> 16);
  } else {
    reinterpret_cast<typename DtypeTraits<S>::Storage*>(s.exp_avg)[i] =
        DtypeTraits<S>::from_float(m);
    reinterpret_cast<typename DtypeTraits<S>::Storage*>(s.exp_avg_sq)[i] =
        DtypeTraits<S>::from_float(v);
  }
  if constexpr (C != Dtype::kFloat32) {
    reinterpret_cast<u16*>(s.param_copy)[i] = DtypeTraits<C>::from_float(p);
  }
  return ok ? 0u : 1u;
}

// Elements before every buffer of `s` reaches a common 8-element (vector) boundary, or ~0 when
// the buffers never do together.
template <Dtype G, Dtype S, Dtype C>
__device__ std::uint64_t vector_head(const AdamKernelSubgroup& s) {
  return adam_vector_head(s, dtype_size(G), dtype_size(S), C != Dtype::kFloat32 ? 2 : 0);
}

template <Dtype G, Dtype S, Dtype C>
__device__ void adam_subgroup(const AdamCoefficients& t, const AdamKernelSubgroup& s,
                              unsigned long long* nonfinite, bool stochastic) {
  constexpr unsigned kV = kAdamVectorElements;
  const std::uint64_t n = s.count;
  const std::uint64_t thread = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t threads = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  unsigned rejected = 0;

  std::uint64_t head = vector_head<G, S, C>(s);
  if (head > n) head = n;  // also the unaligned case: everything one by one
  const std::uint64_t vectors = (n - head) / kV;
  const std::uint64_t tail = head + vectors * kV;
  for (std::uint64_t i = thread; i < head; i += threads) {
    rejected += step1<G, S, C>(t, s, i, stochastic);
  }
  for (std::uint64_t i = tail + thread; i < n; i += threads) {
    rejected += step1<G, S, C>(t, s, i, stochastic);
  }

  const void* grad = reinterpret_cast<const void*>(s.grad);
  for (std::uint64_t k = thread; k < vectors; k += threads) {
    const std::uint64_t i = head + k * kV;
    float g[kV], p[kV], m[kV], v[kV];
    load8<G>(grad, i, g);
    load8<Dtype::kFloat32>(reinterpret_cast<const void*>(s.param), i, p);
    load8<S>(reinterpret_cast<const void*>(s.exp_avg), i, m);
    load8<S>(reinterpret_cast<const void*>(s.exp_avg_sq), i, v);
#pragma unroll
    for (unsigned e = 0; e < kV; ++e)
      rejected += adam_element<DeviceMath>(t, g[e], p[e], m[e], v[e]) ? 0u : 1u;
    store8<Dtype::kFloat32>(reinterpret_cast<void*>(s.param), i, p);
    if (S == Dtype::kBFloat16 && stochastic) {
      std::uint32_t bits[kV];
#pragma unroll
      for (unsigned e = 0; e < kV; ++e) bits[e] = moment_bits(t, s, i + e);
      store8_rounded(reinterpret_cast<void*>(s.exp_avg), i, m, bits, false);
      store8_rounded(reinterpret_cast<void*>(s.exp_avg_sq), i, v, bits, true);
    } else {
      store8<S>(reinterpret_cast<void*>(s.exp_avg), i, m);
      store8<S>(reinterpret_cast<void*>(s.exp_avg_sq), i, v);
    }
    if constexpr (C != Dtype::kFloat32) store8<C>(reinterpret_cast<void*>(s.param_copy), i, p);
  }

  // One atomic per warp, and only where something was rejected.
  const unsigned warp_total = __reduce_add_sync(0xffffffffu, rejected);
  if ((threadIdx.x & 31u) == 0 && warp_total != 0) atomicAdd(nonfinite, warp_total);
}

// 8-bit moments (kernels/quant8.h): one warp per quantization block, 8 elements per lane, so the
// block's new moments stay in registers while the warp reduces their absmax. Lanes whose
// elements lie past the subgroup's end (a partial last block) take part in the reduction with 0.
template <Dtype G, Dtype C>
__device__ void adam_q8_subgroup(const AdamCoefficients& t, const AdamKernelSubgroup& s,
                                 unsigned long long* nonfinite) {
  constexpr unsigned kV = kAdamVectorElements;
  static_assert(kQuantBlock == 32 * kV, "a warp's lanes cover one quantization block");
  const std::uint64_t n = s.count;
  const unsigned lane = threadIdx.x & 31u;
  const std::uint64_t warp =
      (static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32u;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32u;
  const std::uint64_t blocks = quant_blocks(n);
  // Vector loads need 16-byte alignment of every element buffer at element 8·k (the codes are at
  // a kQuantBlock-byte boundary, which the launcher checks).
  bool vector = s.grad % 16 == 0 && s.param % 16 == 0;
  if constexpr (C != Dtype::kFloat32) vector = vector && s.param_copy % 16 == 0;
  auto* codes_m = reinterpret_cast<std::uint8_t*>(s.exp_avg);
  auto* codes_v = reinterpret_cast<std::uint8_t*>(s.exp_avg_sq);
  auto* scales_m = reinterpret_cast<float*>(s.exp_avg_scale);
  auto* scales_v = reinterpret_cast<float*>(s.exp_avg_sq_scale);
  unsigned rejected = 0;

  for (std::uint64_t b = warp; b < blocks; b += warps) {
    const std::uint64_t i = b * kQuantBlock + lane * kV;
    const unsigned k = i >= n ? 0u : (n - i >= kV ? kV : static_cast<unsigned>(n - i));
    const float scale_m = scales_m[b];
    const float scale_v = scales_v[b];
    float g[kV], p[kV], m[kV], v[kV];
    std::uint8_t cm[kV], cv[kV];
    if (k == kV && vector) {
      load8<G>(reinterpret_cast<const void*>(s.grad), i, g);
      load8<Dtype::kFloat32>(reinterpret_cast<const void*>(s.param), i, p);
      const uint2 wm = *reinterpret_cast<const uint2*>(codes_m + i);
      const uint2 wv = *reinterpret_cast<const uint2*>(codes_v + i);
#pragma unroll
      for (unsigned e = 0; e < 4; ++e) {
        cm[e] = static_cast<std::uint8_t>(wm.x >> (8 * e));
        cm[e + 4] = static_cast<std::uint8_t>(wm.y >> (8 * e));
        cv[e] = static_cast<std::uint8_t>(wv.x >> (8 * e));
        cv[e + 4] = static_cast<std::uint8_t>(wv.y >> (8 * e));
      }
    } else {
      // Unrolled, with a predicate: registers, never a local-memory array indexed at run time.
#pragma unroll
      for (unsigned e = 0; e < kV; ++e) {
        if (e >= k) continue;
        g[e] = load_one<G>(reinterpret_cast<const void*>(s.grad), i + e);
        p[e] = reinterpret_cast<const float*>(s.param)[i + e];
        cm[e] = codes_m[i + e];
        cv[e] = codes_v[i + e];
      }
    }
    float absmax_m = 0.0f, absmax_v = 0.0f;
#pragma unroll
    for (unsigned e = 0; e < kV; ++e) {
      if (e >= k) continue;
      m[e] = q8_exp_avg_value<DeviceMath>(cm[e], scale_m);
      v[e] = q8_exp_avg_sq_value<DeviceMath>(cv[e], scale_v);
      rejected += adam_element<DeviceMath, true>(t, g[e], p[e], m[e], v[e]) ? 0u : 1u;
      const float am = m[e] < 0.0f ? -m[e] : m[e];
      const float av = v[e] < 0.0f ? -v[e] : v[e];
      absmax_m = am > absmax_m ? am : absmax_m;
      absmax_v = av > absmax_v ? av : absmax_v;
    }
    if (k == kV && vector) {
      store8<Dtype::kFloat32>(reinterpret_cast<void*>(s.param), i, p);
      if constexpr (C != Dtype::kFloat32) store8<C>(reinterpret_cast<void*>(s.param_copy), i, p);
    } else {
#pragma unroll
      for (unsigned e = 0; e < kV; ++e) {
        if (e >= k) continue;
        reinterpret_cast<float*>(s.param)[i + e] = p[e];
        if constexpr (C != Dtype::kFloat32) {
          reinterpret_cast<u16*>(s.param_copy)[i + e] = DtypeTraits<C>::from_float(p[e]);
        }
      }
    }
    // Non-negative floats order as their bit patterns: the warp's max of the bits is the absmax.
    absmax_m = bits_float(__reduce_max_sync(0xffffffffu, float_bits(absmax_m)));
    absmax_v = bits_float(__reduce_max_sync(0xffffffffu, float_bits(absmax_v)));
    // A corrupt block (a scale that is not finite) rejected every element: codes and scales stay.
    if (!(isfinite(scale_m) && isfinite(scale_v))) continue;
    const Q8Normalizer nm = q8_normalizer<DeviceMath>(absmax_m);
    const Q8Normalizer nv = q8_normalizer<DeviceMath>(absmax_v);
#pragma unroll
    for (unsigned e = 0; e < kV; ++e) {
      if (e >= k) continue;
      cm[e] = q8_exp_avg_code<DeviceMath>(m[e], nm);
      cv[e] = q8_exp_avg_sq_code<DeviceMath>(v[e], nv);
    }
    if (k == kV) {
      unsigned w[4] = {0, 0, 0, 0};
#pragma unroll
      for (unsigned e = 0; e < 4; ++e) {
        w[0] |= static_cast<unsigned>(cm[e]) << (8 * e);
        w[1] |= static_cast<unsigned>(cm[e + 4]) << (8 * e);
        w[2] |= static_cast<unsigned>(cv[e]) << (8 * e);
        w[3] |= static_cast<unsigned>(cv[e + 4]) << (8 * e);
      }
      *reinterpret_cast<uint2*>(codes_m + i) = make_uint2(w[0], w[1]);
      *reinterpret_cast<uint2*>(codes_v + i) = make_uint2(w[2], w[3]);
    } else {
#pragma unroll
      for (unsigned e = 0; e < kV; ++e) {
        if (e >= k) continue;
        codes_m[i + e] = cm[e];
        codes_v[i + e] = cv[e];
      }
    }
    // Every lane read the scales before the reductions above.
    if (lane == 0) {
      scales_m[b] = absmax_m;
      scales_v[b] = absmax_v;
    }
  }

  const unsigned warp_total = __reduce_add_sync(0xffffffffu, rejected);
  if (lane == 0 && warp_total != 0) atomicAdd(nonfinite, warp_total);
}

template <Dtype G>
__device__ void with_q8_copy(const AdamKernelParams& p, const AdamKernelSubgroup& s,
                             unsigned long long* nonfinite) {
  if (!p.has_copy) return adam_q8_subgroup<G, Dtype::kFloat32>(p.terms, s, nonfinite);
  if (p.copy_dtype == Dtype::kFloat16) {
    return adam_q8_subgroup<G, Dtype::kFloat16>(p.terms, s, nonfinite);
  }
  return adam_q8_subgroup<G, Dtype::kBFloat16>(p.terms, s, nonfinite);
}

// bf16 master weights (adam_master_element), one element per thread and step: consecutive
// threads touch consecutive 2-byte values, so each warp's loads and stores stay coalesced.
template <Dtype G, Dtype S>
__device__ void adam_master_subgroup(const AdamCoefficients& t, const AdamKernelSubgroup& s,
                                     unsigned long long* nonfinite) {
  const std::uint64_t thread = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t threads = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  auto* w_bits = reinterpret_cast<u16*>(s.param);
  auto* c_bits = reinterpret_cast<u16*>(s.param_comp);
  auto* m_out = reinterpret_cast<typename DtypeTraits<S>::Storage*>(s.exp_avg);
  auto* v_out = reinterpret_cast<typename DtypeTraits<S>::Storage*>(s.exp_avg_sq);
  unsigned rejected = 0;
  for (std::uint64_t i = thread; i < s.count; i += threads) {
    float w = bf16_to_float(w_bits[i]);
    float c = bf16_to_float(c_bits[i]);
    float m = load_one<S>(reinterpret_cast<const void*>(s.exp_avg), i);
    float v = load_one<S>(reinterpret_cast<const void*>(s.exp_avg_sq), i);
    const float g = load_one<G>(reinterpret_cast<const void*>(s.grad), i);
    if (!adam_master_element<DeviceMath>(t, g, w, c, m, v)) ++rejected;
    w_bits[i] = float_to_bf16(w);
    c_bits[i] = float_to_bf16(c);
    m_out[i] = DtypeTraits<S>::from_float(m);
    v_out[i] = DtypeTraits<S>::from_float(v);
  }
  const unsigned warp_total = __reduce_add_sync(0xffffffffu, rejected);
  if ((threadIdx.x & 31u) == 0 && warp_total != 0) atomicAdd(nonfinite, warp_total);
}

template <Dtype G, Dtype S>
__device__ void with_copy(const AdamKernelParams& p, const AdamKernelSubgroup& s,
                          unsigned long long* nonfinite) {
  if (p.master_dtype == Dtype::kBFloat16) {
    return adam_master_subgroup<G, S>(p.terms, s, nonfinite);
  }
  const bool stochastic = p.moment_rounding == MomentRounding::kStochastic;
  if (!p.has_copy) return adam_subgroup<G, S, Dtype::kFloat32>(p.terms, s, nonfinite, stochastic);
  if (p.copy_dtype == Dtype::kFloat16) {
    return adam_subgroup<G, S, Dtype::kFloat16>(p.terms, s, nonfinite, stochastic);
  }
  return adam_subgroup<G, S, Dtype::kBFloat16>(p.terms, s, nonfinite, stochastic);
}

template <Dtype G>
__device__ void with_state(const AdamKernelParams& p, const AdamKernelSubgroup& s,
                           unsigned long long* nonfinite) {
  if (p.state_dtype == Dtype::kBFloat16) return with_copy<G, Dtype::kBFloat16>(p, s, nonfinite);
  return with_copy<G, Dtype::kFloat32>(p, s, nonfinite);
}

}  // namespace
}  // namespace tide::kernels

// __grid_constant__: the kernel reads its parameters (the descriptor of blockIdx.y among them)
// in place, never from a per-thread copy in local memory.
extern "C" __global__ void __launch_bounds__(tide::kernels::kAdamBlockThreads)
    tide_adam_step(const __grid_constant__ tide::kernels::AdamKernelParams p) {
  using namespace tide::kernels;
  if (blockIdx.y >= p.subgroup_count) return;
  const AdamKernelSubgroup& s = p.subgroups[blockIdx.y];
  auto* nonfinite = reinterpret_cast<unsigned long long*>(p.nonfinite) + blockIdx.y;
  switch (p.grad_dtype) {
    case Dtype::kBFloat16:
      return with_state<Dtype::kBFloat16>(p, s, nonfinite);
    case Dtype::kFloat16:
      return with_state<Dtype::kFloat16>(p, s, nonfinite);
    default:
      return with_state<Dtype::kFloat32>(p, s, nonfinite);
  }
}

// 8-bit moments (p.state_format kBlockQ8): a kernel of its own, so that its registers (the warp
// holds a quantization block's new moments until its absmax is known) do not lower the occupancy
// of tide_adam_step.
extern "C" __global__ void __launch_bounds__(tide::kernels::kAdamBlockThreads)
    tide_adam_step_q8(const __grid_constant__ tide::kernels::AdamKernelParams p) {
  using namespace tide::kernels;
  if (blockIdx.y >= p.subgroup_count) return;
  const AdamKernelSubgroup& s = p.subgroups[blockIdx.y];
  auto* nonfinite = reinterpret_cast<unsigned long long*>(p.nonfinite) + blockIdx.y;
  switch (p.grad_dtype) {
    case Dtype::kBFloat16:
      return with_q8_copy<Dtype::kBFloat16>(p, s, nonfinite);
    case Dtype::kFloat16:
      return with_q8_copy<Dtype::kFloat16>(p, s, nonfinite);
    default:
      return with_q8_copy<Dtype::kFloat32>(p, s, nonfinite);
  }
}
