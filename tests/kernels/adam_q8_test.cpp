// 8-bit block-wise moments (kernels/quant8.h): the code maps against their definition; the step
// of every implementation (the CPU variants, each forced, and the CUDA kernel's own source run
// on the host, kernels/cuda/adam.cu) against reference_q8_step, a float64 reference of the same
// quantized algorithm written plainly here, and bit for bit against each other. Lengths below,
// at and across block boundaries (partial last blocks, blocks across thread chunks), several
// subgroups per launch, zero blocks, huge and tiny blocks (subnormal scales), non-finite
// gradients, corrupt (non-finite) scales, nearest-code ties, and misaligned subgroups refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/adam_kernel.h"
#include "kernels/cpu_adam.h"
#include "kernels/host/grid.h"
#include "kernels/host_kernel.h"
#include "kernels/quant8.h"
#include "tests/kernels/adam_test_util.h"

namespace tide::kernels::testing {
namespace {

constexpr std::size_t kB = kQuantBlock;
const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- The code maps, from their definition (kernels/quant8.h), in float64 ----

double tree_magnitude(unsigned code, unsigned bits) {
  if (code == 0) return 0.0;
  unsigned width = 0;
  while ((code >> width) != 0) ++width;
  const unsigned zeros = bits - width;
  const unsigned fraction_bits = bits - 1 - zeros;
  const unsigned f = code & ((1u << fraction_bits) - 1u);
  return (0.1 + 0.9 * (f + 1) / std::ldexp(1.0, static_cast<int>(fraction_bits))) /
         std::pow(10.0, zeros);
}

TEST(Quant8MapsTest, EveryEntryIsItsDefinitionRoundedOnce) {
  for (unsigned c = 0; c < 256; ++c) {
    EXPECT_EQ(kQ8UnsignedValues[c], static_cast<float>(tree_magnitude(c, 8))) << "code " << c;
  }
  for (unsigned c = 0; c < 128; ++c) {
    EXPECT_EQ(kQ8SignedMagnitudes[c], static_cast<float>(tree_magnitude(c, 7))) << "code " << c;
  }
  for (unsigned j = 0; j < 255; ++j) {
    const double mid = (double{kQ8UnsignedValues[j]} + kQ8UnsignedValues[j + 1]) / 2;
    EXPECT_EQ(kQ8UnsignedMidpoints[j], static_cast<float>(mid)) << "midpoint " << j;
    EXPECT_LT(kQ8UnsignedValues[j], kQ8UnsignedMidpoints[j]);
    EXPECT_LT(kQ8UnsignedMidpoints[j], kQ8UnsignedValues[j + 1]);
  }
  for (unsigned j = 0; j < 127; ++j) {
    const double mid = (double{kQ8SignedMagnitudes[j]} + kQ8SignedMagnitudes[j + 1]) / 2;
    EXPECT_EQ(kQ8SignedMidpoints[j], static_cast<float>(mid)) << "midpoint " << j;
    EXPECT_LT(kQ8SignedMagnitudes[j], kQ8SignedMidpoints[j]);
    EXPECT_LT(kQ8SignedMidpoints[j], kQ8SignedMagnitudes[j + 1]);
  }
  // The block maximum is exact; the smallest values are 1e-7 (unsigned) and 1e-6 (signed).
  EXPECT_EQ(kQ8UnsignedValues[255], 1.0f);
  EXPECT_EQ(kQ8SignedMagnitudes[127], 1.0f);
  EXPECT_EQ(kQ8UnsignedValues[1], 1e-7f);
  EXPECT_EQ(kQ8SignedMagnitudes[1], 1e-6f);
  EXPECT_EQ(q8_exp_avg_value<HostMath>(0x80, 3.0f), 0.0f);
  EXPECT_EQ(q8_exp_avg_value<HostMath>(0xff, 3.0f), -3.0f);
}

// Nearest code by a plain scan; a y exactly on an fp32 midpoint goes to the lower code.
unsigned scan_code(const float* midpoints, unsigned count, float y) {
  unsigned code = 0;
  for (unsigned j = 0; j < count; ++j) code += y > midpoints[j] ? 1u : 0u;
  return code;
}

TEST(Quant8MapsTest, CodesAreNearestWithTiesToTheLowerCode) {
  const Q8Normalizer one = q8_normalizer<HostMath>(1.0f);
  ASSERT_EQ(one.pre, 1.0f);
  ASSERT_EQ(one.inv, 1.0f);
  for (unsigned j = 0; j < 255; ++j) {
    const float mid = kQ8UnsignedMidpoints[j];
    EXPECT_EQ(q8_exp_avg_sq_code<HostMath>(mid, one), j) << "on midpoint " << j;
    EXPECT_EQ(q8_exp_avg_sq_code<HostMath>(std::nextafter(mid, 2.0f), one), j + 1);
    EXPECT_EQ(q8_exp_avg_sq_code<HostMath>(kQ8UnsignedValues[j], one), j);
  }
  for (unsigned j = 0; j < 127; ++j) {
    const float mid = kQ8SignedMidpoints[j];
    EXPECT_EQ(q8_exp_avg_code<HostMath>(mid, one), j);
    EXPECT_EQ(q8_exp_avg_code<HostMath>(-mid, one), j == 0 ? 0u : (0x80u | j));
    EXPECT_EQ(q8_exp_avg_code<HostMath>(std::nextafter(mid, 2.0f), one), j + 1);
    EXPECT_EQ(q8_exp_avg_code<HostMath>(-std::nextafter(mid, 2.0f), one), 0x80u | (j + 1));
  }
  std::mt19937_64 rng(fresh_seed());
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int i = 0; i < 100000; ++i) {
    const float y = unit(rng) * std::pow(10.0f, -8.0f * unit(rng));
    ASSERT_EQ(q8_exp_avg_sq_code<HostMath>(y, one), scan_code(kQ8UnsignedMidpoints, 255, y));
    ASSERT_EQ(q8_exp_avg_code<HostMath>(y, one), scan_code(kQ8SignedMidpoints, 127, y));
  }
  // Zero blocks: every code 0.
  const Q8Normalizer zero = q8_normalizer<HostMath>(0.0f);
  EXPECT_EQ(q8_exp_avg_code<HostMath>(0.0f, zero), 0u);
  EXPECT_EQ(q8_exp_avg_sq_code<HostMath>(0.0f, zero), 0u);
  // Subnormal and huge blocks: the block's maximum still maps to code 1.0.
  for (float absmax : {1e-45f, 1e-40f, 3e-39f, 1e30f, 3.4e38f}) {
    const Q8Normalizer n = q8_normalizer<HostMath>(absmax);
    EXPECT_EQ(q8_exp_avg_sq_code<HostMath>(absmax, n), 255u) << absmax;
    EXPECT_EQ(q8_exp_avg_code<HostMath>(-absmax, n), 0xffu) << absmax;
  }
}

// ---- Subgroups of 8-bit moments ----

// `count` bytes at a kQuantBlock-byte boundary plus `misalign` bytes, canaries around them.
class Codes {
 public:
  static constexpr unsigned char kCanary = 0x5a;
  Codes(std::size_t count, std::size_t misalign = 0)
      : count_(count), storage_(count + 3 * kB, kCanary) {
    const auto address = reinterpret_cast<std::uintptr_t>(storage_.data());
    offset_ = (kB - address % kB) % kB + kB / 2 * (misalign != 0) + misalign;
  }
  Codes(const Codes& other) : Codes(other.count_, other.misalign()) {
    std::memcpy(data(), other.data(), count_);
  }
  std::uint8_t* data() { return storage_.data() + offset_; }
  const std::uint8_t* data() const { return storage_.data() + offset_; }
  std::size_t misalign() const {
    const auto address = reinterpret_cast<std::uintptr_t>(data());
    return address % kB;
  }
  std::vector<std::uint8_t> bytes() const { return {data(), data() + count_}; }
  bool canaries_intact() const {
    for (std::size_t i = 0; i < storage_.size(); ++i) {
      if ((i < offset_ || i >= offset_ + count_) && storage_[i] != kCanary) return false;
    }
    return true;
  }

 private:
  std::size_t count_;
  std::vector<std::uint8_t> storage_;
  std::size_t offset_ = 0;
};

struct Q8Layout {
  Dtype grad = Dtype::kBFloat16;
  std::optional<Dtype> copy;
  std::string name() const {
    return std::string("grad_") + dtype_name(grad) + "_copy_" + (copy ? dtype_name(*copy) : "none");
  }
};

std::vector<Q8Layout> q8_layouts() {
  std::vector<Q8Layout> out;
  for (Dtype g : {Dtype::kFloat32, Dtype::kBFloat16, Dtype::kFloat16}) {
    for (std::optional<Dtype> c : {std::optional<Dtype>{}, std::optional{Dtype::kBFloat16},
                                   std::optional{Dtype::kFloat16}}) {
      out.push_back({g, c});
    }
  }
  return out;
}

// The kinds of block a random subgroup mixes (each block of a subgroup is one of these).
enum class BlockKind { kTypical, kZero, kHuge, kTiny, kNonFiniteGrad, kCorruptScale, kKinds };

struct Q8Subgroup {
  Q8Subgroup(std::size_t n, const Q8Layout& l, unsigned misalign)
      : count(n),
        layout(l),
        grad(n, l.grad, misalign % 8),
        param(n, Dtype::kFloat32, misalign / 2 % 8),
        copy(n, l.copy.value_or(Dtype::kBFloat16), misalign / 3 % 8),
        cm(n),
        cv(n),
        sm(quant_blocks(n)),
        sv(quant_blocks(n)) {}

  // Random contents, block by block of a kind drawn from `kinds` (cycled).
  void fill(std::mt19937_64& rng, float grad_scale, bool with_specials) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> byte(0, 255);
    for (std::size_t b = 0; b < quant_blocks(count); ++b) {
      const auto kind = with_specials
                            ? static_cast<BlockKind>(rng() % static_cast<int>(BlockKind::kKinds))
                            : BlockKind::kTypical;
      float gmul = 1.0f, mscale = 0.1f, vscale = 1e-2f;
      if (kind == BlockKind::kHuge) gmul = 1e15f, mscale = 1e14f, vscale = 1e30f;
      // Tiny: the stored second-moment scale is subnormal; the new moments stay normal (fp32
      // and float64 would disagree on subnormal results by more than rounding).
      if (kind == BlockKind::kTiny) gmul = 1e-17f, mscale = 1e-18f, vscale = 1e-40f;
      sm[b] = mscale * (0.5f + std::fabs(normal(rng)));
      sv[b] = vscale * (0.5f + std::fabs(normal(rng)));
      const bool zero = kind == BlockKind::kZero;
      if (zero) sm[b] = sv[b] = 0.0f;
      if (kind == BlockKind::kCorruptScale) (rng() % 2 ? sm[b] : sv[b]) = rng() % 2 ? kNaN : kInf;
      const std::size_t end = std::min(count, (b + 1) * kB);
      for (std::size_t i = b * kB; i < end; ++i) {
        const bool zero_grad = zero && rng() % 2 == 0;
        grad.set(i, zero_grad ? 0.0f : normal(rng) * gmul * grad_scale);
        param.set(i, normal(rng));
        copy.set(i, 12345.0f);
        cm.data()[i] = zero ? 0 : static_cast<std::uint8_t>(byte(rng));
        cv.data()[i] = zero ? 0 : static_cast<std::uint8_t>(byte(rng));
      }
      if (kind == BlockKind::kNonFiniteGrad) {
        const std::size_t n = end - b * kB;
        grad.set(b * kB + rng() % n, kNaN);
        grad.set(b * kB + rng() % n, -kInf);
        grad.set(end - 1, kInf);
      }
    }
  }

  AdamSubgroup view() {
    AdamSubgroup s;
    s.grad = grad.data();
    s.param = static_cast<float*>(param.data());
    s.exp_avg = cm.data();
    s.exp_avg_sq = cv.data();
    s.param_copy = layout.copy ? copy.data() : nullptr;
    s.count = count;
    s.grad_dtype = layout.grad;
    s.copy_dtype = layout.copy.value_or(Dtype::kBFloat16);
    s.state_format = StateFormat::kBlockQ8;
    s.exp_avg_scale = sm.data();
    s.exp_avg_sq_scale = sv.data();
    return s;
  }

  AdamKernelSubgroup kernel_view() {
    auto address = [](const void* p) { return reinterpret_cast<std::uint64_t>(p); };
    return {address(grad.data()),
            address(param.data()),
            address(cm.data()),
            address(cv.data()),
            layout.copy ? address(copy.data()) : 0,
            count,
            address(sm.data()),
            address(sv.data()),
            0};
  }

  std::size_t count;
  Q8Layout layout;
  Buffer grad, param, copy;
  Codes cm, cv;
  std::vector<float> sm, sv;
};

// Every output byte of `a` equals `b`'s, and nothing was written outside the buffers.
void expect_same_bytes(const Q8Subgroup& a, const Q8Subgroup& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.param.bytes(a.count), b.param.bytes(b.count)) << "weights";
  EXPECT_EQ(a.cm.bytes(), b.cm.bytes()) << "exp_avg codes";
  EXPECT_EQ(a.cv.bytes(), b.cv.bytes()) << "exp_avg_sq codes";
  // As bytes: a corrupt block's NaN scale must stay the same NaN.
  auto bytes = [](const std::vector<float>& x) {
    std::vector<std::uint32_t> out;
    out.reserve(x.size());
    for (float f : x) out.push_back(float_bits(f));
    return out;
  };
  EXPECT_EQ(bytes(a.sm), bytes(b.sm)) << "exp_avg scales";
  EXPECT_EQ(bytes(a.sv), bytes(b.sv)) << "exp_avg_sq scales";
  if (a.layout.copy) {
    EXPECT_EQ(a.copy.bytes(a.count), b.copy.bytes(b.count)) << "copy";
  }
  for (const Buffer* x : {&a.grad, &a.param, &a.copy}) EXPECT_TRUE(x->canaries_intact());
  EXPECT_TRUE(a.cm.canaries_intact());
  EXPECT_TRUE(a.cv.canaries_intact());
}

// ---- reference_q8_step: the quantized algorithm in float64, written plainly ----

struct ReferenceBlock {
  std::vector<double> p, m, v;  // new values (rejected elements: the old, dequantized ones)
  std::vector<bool> rejected;
  double absmax_m = 0, absmax_v = 0;
  // What fp32's rounding errors in the block's moments are a few ulps of, over its updated
  // elements: |m_old| + |g/scale| + |wd·p| for m (m + w·(g − m) may cancel), and for v
  // (1 − β2)(|g'| + |g/scale| + |wd·p|)², g' = g/scale + wd·p (Adam's coupled weight decay may
  // cancel in g', whose error then grows its square's relative error).
  double inputs_m = 0, inputs_v = 0;
  bool corrupt = false;  // a stored scale was not finite: the block stays as it was
};

double dequantize_m(std::uint8_t code, float scale) {
  const double magnitude = double{kQ8SignedMagnitudes[code & 0x7f]} * scale;
  return (code & 0x80) != 0 ? -magnitude : magnitude;
}

double dequantize_v(std::uint8_t code, float scale) {
  return double{kQ8UnsignedValues[code]} * scale;
}

// The step of one block of `s` (its state before the step), every operation in float64.
ReferenceBlock reference_q8_step(const AdamHyper& h, const Q8Subgroup& s, std::size_t b) {
  ReferenceBlock r;
  const float scale_m = s.sm[b], scale_v = s.sv[b];
  r.corrupt = !std::isfinite(scale_m) || !std::isfinite(scale_v);
  for (std::size_t i = b * kB; i < std::min(s.count, (b + 1) * kB); ++i) {
    const double g = s.grad.get(i), p = s.param.get(i);
    const double m = dequantize_m(s.cm.data()[i], scale_m);
    const double v = dequantize_v(s.cv.data()[i], scale_v);
    const Values out = reference_step(h, g, p, m, v, adam_coefficients(h).m_bound);
    const bool rejected = r.corrupt || !std::isfinite(g);
    r.rejected.push_back(rejected);
    r.p.push_back(rejected ? p : out.p);
    r.m.push_back(rejected ? m : out.m);
    r.v.push_back(rejected ? v : out.v);
    r.absmax_m = std::max(r.absmax_m, std::fabs(r.m.back()));
    r.absmax_v = std::max(r.absmax_v, std::fabs(r.v.back()));
    if (!rejected) {
      const double decay = h.decoupled ? 0 : h.weight_decay * p;
      const double inputs_g = std::fabs(g) / h.grad_scale + std::fabs(decay);
      const double g_step = (h.maximize ? -g : g) / h.grad_scale + decay;
      r.inputs_m = std::max(r.inputs_m, std::fabs(m) + inputs_g);
      r.inputs_v = std::max(r.inputs_v, (1 - h.beta2) * std::pow(std::fabs(g_step) + inputs_g, 2));
    }
  }
  return r;
}

// Nearest code to x / absmax in float64 (ties to the lower one): magnitudes over `values`.
unsigned reference_code(const float* values, unsigned count, double x, double absmax) {
  if (absmax == 0) return 0;
  const double y = std::fabs(x) / absmax;
  unsigned code = 0;
  for (unsigned j = 0; j + 1 < count; ++j) {
    if (y > (double{values[j]} + values[j + 1]) / 2) code = j + 1;
  }
  return code;
}

// Whether x / absmax lies so near the midpoint between codes a and a + 1 that fp32 rounding
// (the kernels') and float64 (the reference's) may fall on either side of it: within a relative
// 1e-5 of it, or 1e-6 of the block's maximum (a first moment that cancels, m + w·(g − m) near 0,
// has an fp32 error of a few ulps of its inputs, not of itself).
bool near_midpoint(const float* values, unsigned a, double x, double absmax) {
  const double mid = (double{values[a]} + values[a + 1]) / 2;
  return std::fabs(std::fabs(x) / absmax - mid) <= 1e-5 * mid + 1e-6;
}

// Checks the kernel's result `after` of the step on `before` against reference_q8_step:
// rejected elements and corrupt blocks exactly, the rest within what fp32 allows.
void expect_reference(const AdamHyper& h, const Q8Subgroup& before, const Q8Subgroup& after,
                      std::uint64_t nonfinite, ErrorNorms& norms) {
  std::uint64_t rejected = 0;
  std::size_t code_mismatches = 0;
  for (std::size_t b = 0; b < quant_blocks(before.count); ++b) {
    const ReferenceBlock r = reference_q8_step(h, before, b);
    if (r.corrupt) {
      // The same bits: a NaN scale stays the same NaN.
      EXPECT_EQ(float_bits(after.sm[b]), float_bits(before.sm[b])) << "block " << b;
      EXPECT_EQ(float_bits(after.sv[b]), float_bits(before.sv[b])) << "block " << b;
    } else {
      // The kernels' absmax is the largest of their fp32 moments: off the reference's by at
      // most the largest element's error (a relative 2e-6, plus 4 ulps of its inputs where they
      // cancelled: a block's largest |m| was 2.2e-6 off relative, seed 1283773993067950688).
      EXPECT_NEAR(after.sm[b], r.absmax_m, 2e-6 * r.absmax_m + 4 * 0x1p-24 * r.inputs_m)
          << "block " << b;
    }
    // A block whose second moments are all (nearly) subnormal in fp32, where fp32 keeps fewer
    // bits than rounding accounts for (a tiny block with gradients that underflowed, e.g. to
    // fp16 zeros): its exp_avg_sq is checked bit for bit against the other implementations only.
    const bool subnormal_v = r.absmax_v < 1e-36;
    if (!r.corrupt && !subnormal_v) {
      // As absmax_m (Adam's coupled weight decay left a block's largest v 3.5e-6 off relative,
      // seed 11736278373488317024).
      EXPECT_NEAR(after.sv[b], r.absmax_v, 2e-6 * r.absmax_v + 4 * 0x1p-24 * r.inputs_v)
          << "block " << b;
    }
    for (std::size_t e = 0; e < r.p.size(); ++e) {
      const std::size_t i = b * kB + e;
      const std::uint8_t cm = after.cm.data()[i], cv = after.cv.data()[i];
      if (r.rejected[e]) {
        ++rejected;
        EXPECT_EQ(after.param.get(i), before.param.get(i)) << "rejected element " << i;
      } else {
        const float out[3] = {after.param.get(i), static_cast<float>(r.m[e]),
                              static_cast<float>(r.v[e])};
        norms.add(out, {r.p[e], r.m[e], r.v[e]});
      }
      if (after.layout.copy) {
        const float p = after.param.get(i);
        const auto bits = static_cast<const std::uint16_t*>(after.copy.data())[i];
        EXPECT_EQ(bits, *after.layout.copy == Dtype::kFloat16 ? float_to_fp16(p) : float_to_bf16(p))
            << "copy " << i;
      }
      if (r.corrupt) {
        EXPECT_EQ(cm, before.cm.data()[i]);
        EXPECT_EQ(cv, before.cv.data()[i]);
        continue;
      }
      // Codes: the reference's, or its neighbour where the value sits on a midpoint.
      const unsigned want_m = reference_code(kQ8SignedMagnitudes, 128, r.m[e], r.absmax_m);
      const unsigned want_v = reference_code(kQ8UnsignedValues, 256, r.v[e], r.absmax_v);
      const unsigned got_m = cm & 0x7fu, got_v = cv;
      const bool m_ok =
          got_m == want_m ||
          (got_m + 1 == want_m && near_midpoint(kQ8SignedMagnitudes, got_m, r.m[e], r.absmax_m)) ||
          (want_m + 1 == got_m && near_midpoint(kQ8SignedMagnitudes, want_m, r.m[e], r.absmax_m));
      const bool sign_ok = got_m == 0 ? (cm & 0x80u) == 0 : ((cm & 0x80u) != 0) == (r.m[e] < 0);
      const bool v_ok =
          subnormal_v || got_v == want_v ||
          (got_v + 1 == want_v && near_midpoint(kQ8UnsignedValues, got_v, r.v[e], r.absmax_v)) ||
          (want_v + 1 == got_v && near_midpoint(kQ8UnsignedValues, want_v, r.v[e], r.absmax_v));
      if (!(m_ok && sign_ok && v_ok) && ++code_mismatches <= 5) {
        ADD_FAILURE() << "element " << i << " (block " << b << "): codes m " << unsigned{cm}
                      << " v " << got_v << ", reference m " << want_m
                      << (r.m[e] < 0 ? " (negative)" : "") << " v " << want_v << " for m " << r.m[e]
                      << " / " << r.absmax_m << ", v " << r.v[e] << " / " << r.absmax_v;
      }
    }
  }
  EXPECT_EQ(code_mismatches, 0u);
  EXPECT_EQ(nonfinite, rejected);
}

// ---- Running the implementations ----

std::uint64_t run_cpu(Q8Subgroup& s, const AdamHyper& h, CpuIsa isa, unsigned threads) {
  CpuAdamOptions o;
  o.force_isa = true;
  o.isa = isa;
  o.threads = threads;
  return cpu_adam_step(s.view(), h, o).nonfinite;
}

// The CUDA kernel's source on the host: one launch over `subgroups` (at most 32), grid rows of
// `grid_x` blocks of `block` threads. Returns each subgroup's count of rejected elements.
std::vector<unsigned long long> run_kernel(std::vector<Q8Subgroup*> subgroups, const Q8Layout& l,
                                           const AdamHyper& h, unsigned grid_x, unsigned block) {
  std::vector<unsigned long long> counters(subgroups.size(), 0);
  AdamKernelParams p{};
  p.terms = adam_coefficients(h);
  p.nonfinite = reinterpret_cast<std::uint64_t>(counters.data());
  p.subgroup_count = static_cast<std::uint32_t>(subgroups.size());
  p.grad_dtype = l.grad;
  p.state_dtype = Dtype::kBFloat16;  // ignored: a wrong value must not matter
  p.has_copy = l.copy ? 1 : 0;
  p.copy_dtype = l.copy.value_or(Dtype::kBFloat16);
  p.state_format = StateFormat::kBlockQ8;
  for (std::size_t r = 0; r < subgroups.size(); ++r) p.subgroups[r] = subgroups[r]->kernel_view();
  const HostKernelEntry* adam = find_host_kernel(kAdamQ8Kernel);
  EXPECT_NE(adam, nullptr);
  const HostGrid grid{{grid_x, static_cast<unsigned>(subgroups.size()), 1}, {block, 1, 1}, 0};
  host::run_grid(grid, adam->thread, &p);
  return counters;
}

// Lengths: below a block, at and around block multiples (partial last blocks), and one that
// spans two thread chunks (2^18 elements) so that two threads share the subgroup.
const std::size_t kLengths[] = {0, 1, 7, 8, 9, 255, 256, 257, 511, 513, 1000, 3 * kB + 17};

class AdamQ8Test : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = fresh_seed();
    rng_.seed(seed_);
  }
  std::uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

TEST_F(AdamQ8Test, EveryImplementationMatchesTheFloat64ReferenceAndEachOtherBitForBit) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const std::vector<CpuIsa> isas = supported_isas();
  // Grid shapes for the kernel: one block per row (fewer warps than quantization blocks),
  // several, and more warps than there is work for.
  const std::array<std::array<unsigned, 2>, 3> grids{{{1, 32}, {2, 64}, {3, 256}}};
  unsigned misalign = 0, launch = 0;
  for (const Q8Layout& layout : q8_layouts()) {
    SCOPED_TRACE(layout.name());
    const AdamHyper h = random_hyper(rng_);
    SCOPED_TRACE(describe(h));
    ErrorNorms norms;
    std::vector<std::unique_ptr<Q8Subgroup>> before, kernel;
    for (std::size_t n : kLengths) {
      before.push_back(std::make_unique<Q8Subgroup>(n, layout, misalign++));
      before.back()->fill(rng_, static_cast<float>(h.grad_scale), /*with_specials=*/true);
      kernel.push_back(std::make_unique<Q8Subgroup>(*before.back()));
    }
    // The kernel: every length in one launch (several subgroups per launch).
    std::vector<Q8Subgroup*> rows;
    rows.reserve(kernel.size());
    for (auto& k : kernel) rows.push_back(k.get());
    const auto& g = grids[launch++ % grids.size()];
    const std::vector<unsigned long long> kernel_nonfinite =
        run_kernel(rows, layout, h, g[0], g[1]);
    for (std::size_t c = 0; c < before.size(); ++c) {
      const Q8Subgroup& b = *before[c];
      SCOPED_TRACE("n=" + std::to_string(b.count));
      Q8Subgroup scalar(b);
      const std::uint64_t nonfinite = run_cpu(scalar, h, CpuIsa::kScalar, 1);
      expect_reference(h, b, scalar, nonfinite, norms);
      for (CpuIsa isa : isas) {
        Q8Subgroup other(b);
        EXPECT_EQ(run_cpu(other, h, isa, 1), nonfinite) << isa_name(isa);
        expect_same_bytes(other, scalar, std::string(isa_name(isa)) + " against scalar");
      }
      EXPECT_EQ(kernel_nonfinite[c], nonfinite);
      expect_same_bytes(*kernel[c], scalar, "the CUDA kernel's source against scalar");
    }
    norms.expect_within(1e-6);
    if (HasFailure()) return;
  }
}

TEST_F(AdamQ8Test, ThreadedStepsAcrossChunksEqualTheOneThreadStep) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const Q8Layout layout{Dtype::kBFloat16, Dtype::kBFloat16};
  const AdamHyper h = random_hyper(rng_);
  Q8Subgroup before((std::size_t{1} << 18) + 3 * kB + 100, layout, 3);
  before.fill(rng_, static_cast<float>(h.grad_scale), /*with_specials=*/true);
  Q8Subgroup one(before);
  const std::uint64_t nonfinite = run_cpu(one, h, CpuIsa::kScalar, 1);
  ErrorNorms norms;
  expect_reference(h, before, one, nonfinite, norms);
  norms.expect_within(1e-6);
  for (CpuIsa isa : supported_isas()) {
    Q8Subgroup two(before);
    EXPECT_EQ(run_cpu(two, h, isa, 2), nonfinite);
    expect_same_bytes(two, one, std::string(isa_name(isa)) + " on 2 threads");
  }
  Q8Subgroup kernel(before);
  EXPECT_EQ(run_kernel({&kernel}, layout, h, 7, 256)[0], nonfinite);
  expect_same_bytes(kernel, one, "the CUDA kernel's source");
}

// Moments exactly on the fp32 midpoints go to the lower code in every implementation: with
// β1 = β2 = 0 and lr = 0 the new first moment is the gradient itself, and a gradient of 1 in the
// block makes its scale 1.
TEST_F(AdamQ8Test, MomentsOnAMidpointTakeTheLowerCodeEverywhere) {
  const Q8Layout layout{Dtype::kFloat32, std::nullopt};
  AdamHyper h;
  h.lr = 0.0;
  h.beta1 = 0.0;
  h.beta2 = 0.0;
  Q8Subgroup before(kB, layout, 0);
  before.fill(rng_, 1.0f, /*with_specials=*/false);
  std::vector<unsigned> want(kB);
  for (std::size_t i = 0; i < kB; ++i) {
    const unsigned j = static_cast<unsigned>(i % 127);
    float g = kQ8SignedMidpoints[j];
    want[i] = j;
    if (i % 4 == 1) g = std::nextafter(g, 2.0f), want[i] = j + 1;
    if (i % 2 == 1) g = -g, want[i] |= want[i] != 0 ? 0x80u : 0u;
    before.grad.set(i, g);
  }
  before.grad.set(kB - 1, 1.0f);
  want[kB - 1] = 127;
  std::vector<std::unique_ptr<Q8Subgroup>> outs;
  for (CpuIsa isa : supported_isas()) {
    outs.push_back(std::make_unique<Q8Subgroup>(before));
    run_cpu(*outs.back(), h, isa, 1);
  }
  outs.push_back(std::make_unique<Q8Subgroup>(before));
  run_kernel({outs.back().get()}, layout, h, 1, 32);
  for (const auto& out : outs) {
    EXPECT_EQ(out->sm[0], 1.0f);
    for (std::size_t i = 0; i < kB; ++i) {
      ASSERT_EQ(out->cm.data()[i], want[i])
          << "element " << i << ", gradient " << before.grad.get(i);
    }
  }
}

TEST_F(AdamQ8Test, ZeroStateAndGradientsStayZero) {
  const Q8Layout layout{Dtype::kBFloat16, std::nullopt};
  Q8Subgroup s(2 * kB + 5, layout, 0);
  s.fill(rng_, 1.0f, false);
  for (std::size_t i = 0; i < s.count; ++i) {
    s.grad.set(i, 0.0f);
    s.cm.data()[i] = s.cv.data()[i] = 0;
  }
  std::fill(s.sm.begin(), s.sm.end(), 0.0f);
  std::fill(s.sv.begin(), s.sv.end(), 0.0f);
  Q8Subgroup kernel(s);
  const Q8Subgroup before(s);
  EXPECT_EQ(run_cpu(s, AdamHyper{}, CpuIsa::kScalar, 1), 0u);
  run_kernel({&kernel}, layout, AdamHyper{}, 1, 64);
  for (const Q8Subgroup* out : {&s, &kernel}) {
    EXPECT_EQ(out->cm.bytes(), before.cm.bytes());
    EXPECT_EQ(out->cv.bytes(), before.cv.bytes());
    for (float x : out->sm) EXPECT_EQ(x, 0.0f);
    for (float x : out->sv) EXPECT_EQ(x, 0.0f);
    EXPECT_EQ(out->param.bytes(out->count), before.param.bytes(before.count));
  }
}

TEST_F(AdamQ8Test, SkipSubgroupLeavesQuantizedStateUntouched) {
  const Q8Layout layout{Dtype::kBFloat16, Dtype::kBFloat16};
  Q8Subgroup s(3 * kB, layout, 0);
  s.fill(rng_, 1.0f, false);
  s.grad.set(300, kNaN);
  const Q8Subgroup before(s);
  CpuAdamOptions o;
  o.skip_subgroup_on_nonfinite = true;
  const AdamResult r = cpu_adam_step(s.view(), AdamHyper{}, o);
  EXPECT_FALSE(r.applied);
  EXPECT_EQ(r.nonfinite, 1u);
  EXPECT_EQ(s.cm.bytes(), before.cm.bytes());
  EXPECT_EQ(s.cv.bytes(), before.cv.bytes());
  EXPECT_EQ(s.sm, before.sm);
  EXPECT_EQ(s.param.bytes(s.count), before.param.bytes(before.count));
}

TEST(AdamQ8ValidationTest, RefusesSubgroupsThatDoNotStartOnABlock) {
  const Q8Layout layout{Dtype::kBFloat16, std::nullopt};
  Q8Subgroup s(kB, layout, 0);
  std::mt19937_64 rng(1);
  s.fill(rng, 1.0f, false);
  AdamSubgroup v = s.view();
  EXPECT_NO_THROW(validate(v));
  // A subgroup that starts 100 elements into a block of its tensor.
  v.exp_avg = s.cm.data() + 100;
  try {
    validate(v);
    ADD_FAILURE() << "a misaligned subgroup was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("exp_avg codes do not start at a 256-byte boundary"),
              std::string::npos)
        << e.what();
  }
  v = s.view();
  v.exp_avg_sq = s.cv.data() + 8;
  EXPECT_THROW(validate(v), std::invalid_argument);
  v = s.view();
  v.exp_avg_sq_scale = nullptr;
  EXPECT_THROW(validate(v), std::invalid_argument);
  v = s.view();
  v.state_format = static_cast<StateFormat>(7);
  EXPECT_THROW(validate(v), std::invalid_argument);
  // The moments' dtype does not matter for 8-bit moments.
  v = s.view();
  v.state_dtype = Dtype::kFloat16;
  EXPECT_NO_THROW(validate(v));
}

}  // namespace
}  // namespace tide::kernels::testing

namespace tide::kernels::testing {
namespace {

// A block whose exp_avg_sq codes are 0 (below the map's resolution under the block's scale)
// while its exp_avg codes are not: unclamped, the update would be lr·m/ε (here ~1e4 for
// weights of 1). Clamped to ±m_bound·√v (kernels/adam_math.h) it stays within lr·C·√bc2/bc1,
// and an element with neither gradient nor second moment does not move at all. Every CPU
// variant and the kernel's source alike.
TEST(AdamQ8Guard, AnUnderflowedSecondMomentKeepsTheUpdateBounded) {
  AdamHyper h;  // lr 1e-3, β (0.9, 0.999), ε 1e-8, no weight decay
  h.step = 10;
  const AdamCoefficients c = adam_coefficients(h);
  const double bc1 = 1 - std::pow(h.beta1, 10.0), bc2 = 1 - std::pow(h.beta2, 10.0);
  const double most = h.lr * c.m_bound * std::sqrt(bc2) / bc1;
  const Q8Layout layout{Dtype::kFloat32, std::nullopt};
  auto make = [&] {
    auto s = std::make_unique<Q8Subgroup>(2 * kB, layout, 0);
    for (std::size_t i = 0; i < 2 * kB; ++i) {
      // Even elements: no gradient; odd: a tiny one (its v is then (1 − β2)·g², tiny too).
      s->grad.set(i, i % 2 == 0 ? 0.0f : 1e-6f);
      s->param.set(i, 1.0f);
      s->cm.data()[i] = 127;  // exp_avg = +scale: the block's maximum
      s->cv.data()[i] = i < kB ? 0 : 255;
    }
    s->sm = {0.1f, 0.1f};
    s->sv = {1e-2f, 1e-2f};
    return s;
  };
  auto check = [&](Q8Subgroup& s, const std::string& what) {
    SCOPED_TRACE(what);
    for (std::size_t i = 0; i < kB; ++i) {
      const double moved = std::fabs(double{s.param.get(i)} - 1.0);
      if (i % 2 == 0) {
        EXPECT_EQ(s.param.get(i), 1.0f) << "element " << i;
      } else {
        EXPECT_LE(moved, most * (1 + 1e-6)) << "element " << i;
      }
    }
    // The block with a representable second moment updates as Adam does (m ≪ C·√v).
    for (std::size_t i = kB; i < 2 * kB; ++i) EXPECT_LT(s.param.get(i), 1.0f);
  };
  for (CpuIsa isa : supported_isas()) {
    auto s = make();
    run_cpu(*s, h, isa, 1);
    check(*s, std::string(isa_name(isa)));
  }
  auto k = make();
  run_kernel({k.get()}, layout, h, 1, 32);
  check(*k, "kernel source");
}

}  // namespace
}  // namespace tide::kernels::testing
