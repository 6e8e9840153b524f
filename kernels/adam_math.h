// The element-wise Adam/AdamW step, one definition for every implementation: the scalar CPU
// code, the AVX2 and AVX-512 CPU code (with their own `Math` over vector registers) and the CUDA
// kernel. All of them compute exactly the same function, bit for bit: every operation below is
// an IEEE-754 operation rounded once (fma included), nothing is contracted or reordered, and no
// approximate sqrt/division is used.
//
// The formula follows PyTorch's torch.optim.Adam/AdamW (single-tensor path) operation by
// operation, with the fusions PyTorch's CPU kernels make (lerp, addcmul and add-with-alpha are
// fused multiply-adds there), so that tide tracks PyTorch to the last few ulps:
//
//   g  = grad · grad_mul                       (grad_mul = ±1/loss_scale; − when maximizing)
//   p  = p · decay                             (AdamW: decay = 1 − lr·wd; else 1)
//   g  = fma(l2, p, g)                         (Adam: l2 = wd; else 0)
//   m  = fma(w, g − m, m)                      (m.lerp_(g, 1 − β1); w = 1 − β1 < 0.5)
//   v  = fma((1 − β2)·g, g, v·β2)              (v.mul_(β2).addcmul_(g, g, 1 − β2))
//   p  = p + (−step_size·m) / (√v · (1/√bc2) + ε)
//                                              (p.addcdiv_(m, √v / √bc2 + ε, −step_size))
//
// with step_size = lr / (1 − β1^t) and bc2 = 1 − β2^t computed in double, as Python does. One
// departure: PyTorch divides √v by √bc2, tide multiplies by the reciprocal. A division and a
// square root per element are what the CPU update spends its cycles on (the divider does
// both); the second division made it compute-bound next to the memory traffic on a core (1.35
// against 2.0 billion elements/s in cache on AVX-512). The multiply differs from the division
// by at most an ulp of the denominator, i.e. a relative 6e-8 of one step's update.

#pragma once

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/host_device.h"

#if !defined(__CUDACC__)
#include <cmath>
#endif

namespace tide::kernels {

// The hyperparameters of one step, as torch.optim.Adam/AdamW name them. They may change from
// step to step (learning-rate schedules); nothing here keeps state between steps.
struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // This step's number, counted from 1: PyTorch's state["step"] after its increment.
  std::int64_t step = 1;
  // true: AdamW (weights decayed by lr·weight_decay); false: Adam (weight_decay·p added to the
  // gradient, "L2").
  bool decoupled = true;
  bool maximize = false;
  // The loss-scale factor the gradients carry: they are multiplied by (float)(1/grad_scale), as
  // torch.amp.GradScaler.unscale_ does. 1 means unscaled.
  double grad_scale = 1.0;
  // Stochastic rounding of bf16 moments (kernels/stochastic_round.h): the optimizer's seed, which
  // with `step` keys the rounding (AdamTerms::rounding_key). Unused with nearest rounding.
  std::uint64_t rounding_seed = 0;
};

// The per-step terms of the formula, as values of V (float, or a vector of floats).
template <typename V>
struct AdamTerms {
  V grad_mul;
  V decay;
  V l2;
  V lerp_w;
  V beta2;
  V one_minus_beta2;
  V inv_bc2_sqrt;
  V eps;
  V neg_step_size;
  // 8-bit moments only (adam_update<Math, true>): the numerator's m is clamped to
  // ±m_bound·√v. Exact Adam never needs it: with β1² < β2, Cauchy–Schwarz over the moments' sums
  // gives |m| ≤ C·√v, C = (1 − β1) / √((1 − β2)(1 − β1²/β2)) (m_bound is C·(1 + 2^-10), clear of
  // rounding; the largest float when β1² ≥ β2). Quantized moments break it: a block's exp_avg_sq
  // codes may round to 0 (below the map's 1e-7 of the block's maximum) while exp_avg's do not, and
  // the update would be lr·m/ε. Clamped, an element moves at most lr·C·√bc2/bc1 per step, and not
  // at all while its second moment is below the map's resolution.
  V m_bound;
  V neg_m_bound;
  // PyTorch's lerp changes formula at weight 0.5: for 1 − β1 ≥ 0.5 it computes
  // fma(w − 1, g − m, g), i.e. lerp_w holds w − 1 and the base is g.
  bool lerp_from_grad;
  // rounding_step_key(rounding_seed, step): what stochastic rounding of bf16 moments hashes with
  // each element's global index (kernels/stochastic_round.h).
  std::uint64_t rounding_key = 0;
};

// The terms in fp32: what the host computes once per step and every implementation broadcasts.
using AdamCoefficients = AdamTerms<float>;

// Computes the fp32 terms from the hyperparameters the way PyTorch does (in double, then cast).
// Throws std::invalid_argument for values PyTorch rejects (lr < 0, β outside [0, 1), eps < 0,
// weight_decay < 0, step < 1) and for a grad_scale that is not finite and positive.
AdamCoefficients adam_coefficients(const AdamHyper& hyper);

// The formula over any V, given a Math policy with fma, mul, add, sub, div and sqrt (each
// rounded once) and select(c, a, b) (c ? a : b for a condition that holds for every lane), and
// with kBounded (8-bit moments: AdamTerms::m_bound) lanewise min(a, b) = a < b ? a : b and
// max(a, b) = a > b ? a : b (x86's minps/maxps, so every implementation agrees on zeros' signs).
// Updates p, m, v in place; the caller decides whether to keep the results.
template <typename Math, bool kBounded = false, typename V>
TIDE_HOST_DEVICE void adam_update(const AdamTerms<V>& t, V grad, V& p, V& m, V& v) {
  const V g0 = Math::mul(grad, t.grad_mul);
  p = Math::mul(p, t.decay);
  const V g = Math::fma(t.l2, p, g0);
  m = Math::fma(t.lerp_w, Math::sub(g, m), Math::select(t.lerp_from_grad, g, m));
  v = Math::fma(Math::mul(t.one_minus_beta2, g), g, Math::mul(v, t.beta2));
  const V root = Math::sqrt(v);
  const V denom = Math::add(Math::mul(root, t.inv_bc2_sqrt), t.eps);
  V numerator = m;
  if constexpr (kBounded) {
    numerator = Math::min(Math::max(m, Math::mul(t.neg_m_bound, root)), Math::mul(t.m_bound, root));
  }
  p = Math::add(p, Math::div(Math::mul(t.neg_step_size, numerator), denom));
}

// One element. A non-finite gradient (or a non-finite result, e.g. from an overflow) must never
// reach the weights or the moments: then p, m and v keep their old values and this returns
// false, for the caller to count.
template <typename Math, bool kBounded = false>
TIDE_HOST_DEVICE bool adam_element(const AdamCoefficients& t, float grad, float& p, float& m,
                                   float& v) {
  float np = p, nm = m, nv = v;
  adam_update<Math, kBounded>(t, grad, np, nm, nv);
  if (!(Math::finite(np) && Math::finite(nm) && Math::finite(nv))) return false;
  p = np;
  m = nm;
  v = nv;
  return true;
}

// One element with bf16 master weights (master_dtype bf16): there is no fp32 master, the weight
// is the pair w + c of two bf16 values, the model's bf16 weight w and its compensation c, the
// part of the fp32 weight that rounding to bf16 lost (Kahan-style: updates smaller than half an
// ulp of w accumulate in c until they move w, instead of vanishing). w and c are passed as the
// fp32 values of their bf16 patterns; the caller stores them back with float_to_bf16, which is
// exact for both. The step runs adam_update on p = w + c, then w = bf16(p), c = bf16(p − w).
// The update is rejected (nothing changes, returns false) when the new w or a moment is not
// finite: a finite p that rounds to a bf16 infinity is an overflow like any other.
template <typename Math>
TIDE_HOST_DEVICE bool adam_master_element(const AdamCoefficients& t, float grad, float& w, float& c,
                                          float& m, float& v) {
  float p = Math::add(w, c), nm = m, nv = v;
  adam_update<Math>(t, grad, p, nm, nv);
  const float nw = bf16_to_float(float_to_bf16(p));
  if (!(Math::finite(nw) && Math::finite(nm) && Math::finite(nv))) return false;
  w = nw;
  c = bf16_to_float(float_to_bf16(Math::sub(p, nw)));
  m = nm;
  v = nv;
  return true;
}

#if !defined(__CUDACC__)
// Scalar host math. The kernels are compiled with -ffp-contract=off, so a·b + c stays two
// roundings here; std::fma is the fused one (an instruction where the CPU has FMA, glibc's exact
// emulation where it has not).
struct HostMath {
  static float fma(float a, float b, float c) { return std::fma(a, b, c); }
  static float mul(float a, float b) { return a * b; }
  static float add(float a, float b) { return a + b; }
  static float sub(float a, float b) { return a - b; }
  static float div(float a, float b) { return a / b; }
  static float sqrt(float a) { return std::sqrt(a); }
  static float select(bool c, float a, float b) { return c ? a : b; }
  static float min(float a, float b) { return a < b ? a : b; }
  static float max(float a, float b) { return a > b ? a : b; }
  static bool finite(float a) { return std::isfinite(a); }
};
#endif

#if defined(__CUDACC__) || defined(TIDE_CUDA_HOST)
// Device math: the _rn intrinsics are never contracted or approximated by nvcc, whatever the
// flags (e.g. -use_fast_math), so the kernel computes what the CPU computes. Also the kernels'
// host build (kernels/host/cuda_emulation.h), whose intrinsics are the same IEEE-754 operations.
struct DeviceMath {
  static __device__ __forceinline__ float fma(float a, float b, float c) {
    return __fmaf_rn(a, b, c);
  }
  static __device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
  static __device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
  static __device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
  static __device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
  static __device__ __forceinline__ float sqrt(float a) { return __fsqrt_rn(a); }
  static __device__ __forceinline__ float select(bool c, float a, float b) { return c ? a : b; }
  static __device__ __forceinline__ float min(float a, float b) { return a < b ? a : b; }
  static __device__ __forceinline__ float max(float a, float b) { return a > b ? a : b; }
  static __device__ __forceinline__ bool finite(float a) { return isfinite(a); }
};
#endif

}  // namespace tide::kernels
