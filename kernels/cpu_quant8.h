// The CPU step over 8-bit block-wise moments (kernels/quant8.h), one quantization block at a
// time: dequantize, update (kernels/adam_math.h), then requantize with the block's new absmax.
// The scalar loop here serves the scalar variant and the SIMD variants' partial blocks.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/adam_math.h"
#include "kernels/cpu_adam.h"
#include "kernels/cpu_variant.h"
#include "kernels/dtype.h"
#include "kernels/quant8.h"

namespace tide::kernels {

// The new moments of one block, between the update and the requantization.
struct Q8Block {
  alignas(64) float m[kQuantBlock];
  alignas(64) float v[kQuantBlock];
  float absmax_m = 0.0f;
  float absmax_v = 0.0f;
};

// Elements [i, end) of the block that starts at `first`: the update, the weights and copy stored,
// the new moments kept in `block`. Returns the number rejected.
template <Dtype G, Dtype C>
std::uint64_t q8_update_scalar(const AdamCoefficients& t, const AdamSubgroup& s, std::size_t first,
                               std::size_t i, std::size_t end, Q8Block& block) {
  using GT = DtypeTraits<G>;
  const auto* grad = static_cast<const typename GT::Storage*>(s.grad);
  const auto* cm = static_cast<const std::uint8_t*>(s.exp_avg);
  const auto* cv = static_cast<const std::uint8_t*>(s.exp_avg_sq);
  const float scale_m = s.exp_avg_scale[first / kQuantBlock];
  const float scale_v = s.exp_avg_sq_scale[first / kQuantBlock];
  std::uint64_t rejected = 0;
  for (; i < end; ++i) {
    float p = s.param[i];
    float m = q8_exp_avg_value<HostMath>(cm[i], scale_m);
    float v = q8_exp_avg_sq_value<HostMath>(cv[i], scale_v);
    if (!adam_element<HostMath, true>(t, GT::to_float(grad[i]), p, m, v)) ++rejected;
    s.param[i] = p;
    if constexpr (C != kNoCopy) {
      static_cast<std::uint16_t*>(s.param_copy)[i] = DtypeTraits<C>::from_float(p);
    }
    block.m[i - first] = m;
    block.v[i - first] = v;
    block.absmax_m = std::max(block.absmax_m, std::fabs(m));
    block.absmax_v = std::max(block.absmax_v, std::fabs(v));
  }
  return rejected;
}

// Codes [i, end) of the block that starts at `first`, from `block` with its final absmax.
inline void q8_quantize_scalar(const AdamSubgroup& s, std::size_t first, std::size_t i,
                               std::size_t end, const Q8Block& block) {
  auto* cm = static_cast<std::uint8_t*>(s.exp_avg);
  auto* cv = static_cast<std::uint8_t*>(s.exp_avg_sq);
  const Q8Normalizer nm = q8_normalizer<HostMath>(block.absmax_m);
  const Q8Normalizer nv = q8_normalizer<HostMath>(block.absmax_v);
  for (; i < end; ++i) {
    cm[i] = q8_exp_avg_code<HostMath>(block.m[i - first], nm);
    cv[i] = q8_exp_avg_sq_code<HostMath>(block.v[i - first], nv);
  }
}

// Whether the block's stored scales are finite: if not (corrupt state), every element of the
// block was rejected and its codes and scales stay as they are.
inline bool q8_scales_finite(const AdamSubgroup& s, std::size_t first) {
  return std::isfinite(s.exp_avg_scale[first / kQuantBlock]) &&
         std::isfinite(s.exp_avg_sq_scale[first / kQuantBlock]);
}

inline void q8_store_scales(const AdamSubgroup& s, std::size_t first, const Q8Block& block) {
  s.exp_avg_scale[first / kQuantBlock] = block.absmax_m;
  s.exp_avg_sq_scale[first / kQuantBlock] = block.absmax_v;
}

// The scalar loop over [begin, end): begin a multiple of kQuantBlock, end one or the count.
template <Dtype G, Dtype C>
std::uint64_t adam_q8_scalar_range(const AdamCoefficients& t, const AdamSubgroup& s,
                                   std::size_t begin, std::size_t end) {
  std::uint64_t rejected = 0;
  Q8Block block;
  for (std::size_t first = begin; first < end; first += kQuantBlock) {
    const std::size_t last = std::min(end, first + kQuantBlock);
    block.absmax_m = block.absmax_v = 0.0f;
    rejected += q8_update_scalar<G, C>(t, s, first, first, last, block);
    if (!q8_scales_finite(s, first)) continue;
    q8_quantize_scalar(s, first, first, last, block);
    q8_store_scales(s, first, block);
  }
  return rejected;
}

// The SIMD variants' nearest-code search: kernels/quant8.h's rule (the number of fp32 midpoints
// strictly below y), in one table lookup instead of a binary search. y ≥ 0 falls in a bucket by
// its exponent and top kQ8BucketBits mantissa bits (the bits above its low 16); each bucket holds
// at most one midpoint (checked when the table is built, at compile time), so the code is the
// bucket's base (the midpoints below the bucket) plus 1 if y is above the bucket's midpoint. y and
// that midpoint share the bits above their low 16, so that compare is one of the low 16 bits as
// integers, and one 32-bit load (one gather lane) reads both the base and those bits. Values below
// the first bucket, 2^-26, are below every midpoint; values from 1.0 up fall in the last bucket;
// neither bucket holds a midpoint (checked too).
inline constexpr unsigned kQ8BucketBits = 7;
inline constexpr unsigned kQ8BucketShift = 23 - kQ8BucketBits;
inline constexpr std::int32_t kQ8FirstBucketKey = (127 - 26) << kQ8BucketBits;  // 2^-26
inline constexpr std::int32_t kQ8LastBucketKey = 127 << kQ8BucketBits;          // 1.0
inline constexpr std::int32_t kQ8Buckets = kQ8LastBucketKey - kQ8FirstBucketKey + 1;
// A bucket's entry, 3 bytes at 3 · bucket: the low 16 bits of its midpoint (little-endian), 0xffff
// when it has none (no y in the bucket has low bits above that), then its base.
inline constexpr unsigned kQ8BucketEntryBytes = 3;

struct Q8SearchTable {
  // The buckets' entries; read four bytes at a time by 32-bit gathers: one byte of padding.
  std::uint8_t bucket[kQ8BucketEntryBytes * kQ8Buckets + 1];
  bool one_midpoint_per_bucket;
  // The same search without gathers (the AVX-512 variant, for exp_avg): q8_count_below's binary
  // search, its pivots laid out by step. Step l (of log2(count + 1)) compares y with the midpoint
  // at code + 2^(steps−1−l) − 1, where code, the count so far, is a multiple of 2^(steps−l): so
  // step l's 2^l possible pivots, indexed by code >> (steps − l), are small enough tables for
  // in-register permutes (one register up to 16 entries, vpermi2ps pairs above).
  float pivot[8][128];
};

constexpr Q8SearchTable make_q8_search_table(const float* midpoints, unsigned count) {
  Q8SearchTable t{};
  // The map's midpoints, then +inf up to 256 entries: where the pivots come from.
  float padded[256]{};
  for (unsigned j = 0; j < 256; ++j) {
    padded[j] = j < count ? midpoints[j] : std::numeric_limits<float>::infinity();
  }
  t.one_midpoint_per_bucket = true;
  unsigned below = 0;
  for (std::int32_t b = 0; b < kQ8Buckets; ++b) {
    const std::int32_t key = kQ8FirstBucketKey + b;
    const float lo =
        b == 0 ? 0.0f : std::bit_cast<float>(static_cast<std::uint32_t>(key) << kQ8BucketShift);
    const float hi = b == kQ8Buckets - 1 ? std::numeric_limits<float>::infinity()
                                         : std::bit_cast<float>(static_cast<std::uint32_t>(key + 1)
                                                                << kQ8BucketShift);
    // The midpoints are sorted: those below the bucket, then those inside it.
    while (below < count && midpoints[below] < lo) ++below;
    unsigned inside_end = below;
    while (inside_end < count && midpoints[inside_end] < hi) ++inside_end;
    const unsigned inside = inside_end - below;
    // The first and last buckets span more than one key: their y do not share the midpoint's bits.
    if (inside > 1 || (inside == 1 && (b == 0 || b == kQ8Buckets - 1))) {
      t.one_midpoint_per_bucket = false;
    }
    const std::uint32_t low =
        inside == 0 ? 0xffffu : std::bit_cast<std::uint32_t>(midpoints[below]);
    const auto entry = static_cast<std::size_t>(b) * kQ8BucketEntryBytes;
    t.bucket[entry] = static_cast<std::uint8_t>(low & 0xffu);
    t.bucket[entry + 1] = static_cast<std::uint8_t>((low >> 8) & 0xffu);
    t.bucket[entry + 2] = static_cast<std::uint8_t>(below);
  }
  const unsigned steps = std::bit_width(count);
  for (unsigned l = 0; l < steps; ++l) {
    const unsigned stride = 1u << (steps - l);  // between the codes step l starts from
    for (unsigned j = 0; j < (1u << l); ++j) t.pivot[l][j] = padded[j * stride + stride / 2 - 1];
  }
  return t;
}

inline constexpr Q8SearchTable kQ8SearchExpAvg = make_q8_search_table(kQ8SignedMidpoints, 127);
inline constexpr Q8SearchTable kQ8SearchExpAvgSq = make_q8_search_table(kQ8UnsignedMidpoints, 255);
static_assert(
    kQ8SearchExpAvg.one_midpoint_per_bucket && kQ8SearchExpAvgSq.one_midpoint_per_bucket,
    "a bucket of the nearest-code search holds two midpoints, or its first or last one holds one");

}  // namespace tide::kernels
