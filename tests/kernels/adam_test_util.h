// Test data and references for the Adam kernels: subgroup buffers filled with fresh random data
// (never zeros) at chosen misalignments, the float64 reference step, and the fp32 step of
// kernels/adam_math.h element by element.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/adam_math.h"
#include "kernels/cpu_adam.h"
#include "kernels/dtype.h"

namespace tide::kernels::testing {

inline const char* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::kFloat32:
      return "f32";
    case Dtype::kBFloat16:
      return "bf16";
    case Dtype::kFloat16:
      return "f16";
  }
  return "?";
}

// A fresh seed per run, printed so that a failure can be replayed.
inline std::uint64_t fresh_seed() {
  std::random_device device;
  return (std::uint64_t{device()} << 32) ^ device();
}

// The CPU variants this machine runs, scalar first (the others are compared with it).
inline std::vector<CpuIsa> supported_isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : kCpuIsas) {
    if (cpu_supports(isa)) out.push_back(isa);
  }
  return out;
}

inline float to_float(const void* base, Dtype d, std::size_t i) {
  switch (d) {
    case Dtype::kFloat32:
      return static_cast<const float*>(base)[i];
    case Dtype::kBFloat16:
      return bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case Dtype::kFloat16:
      return fp16_to_float(static_cast<const std::uint16_t*>(base)[i]);
  }
  return NAN;
}

inline void from_float(void* base, Dtype d, std::size_t i, float x) {
  switch (d) {
    case Dtype::kFloat32:
      static_cast<float*>(base)[i] = x;
      return;
    case Dtype::kBFloat16:
      static_cast<std::uint16_t*>(base)[i] = float_to_bf16(x);
      return;
    case Dtype::kFloat16:
      static_cast<std::uint16_t*>(base)[i] = float_to_fp16(x);
      return;
  }
}

// One buffer of `count` elements whose first element sits `misalign` (< 16) elements past a
// 64-byte boundary. The bytes around the elements hold a canary pattern.
class Buffer {
 public:
  static constexpr unsigned char kCanary = 0xa5;

  Buffer() = default;
  Buffer(std::size_t count, Dtype dtype, unsigned misalign)
      : dtype_(dtype),
        count_(count),
        misalign_(misalign),
        storage_(count * dtype_size(dtype) + 128, kCanary) {
    const auto address = reinterpret_cast<std::uintptr_t>(storage_.data());
    offset_ = static_cast<std::size_t>((64 - address % 64) % 64) + misalign * dtype_size(dtype);
  }
  // A copy has the same elements at the same misalignment (its own storage is elsewhere).
  Buffer(const Buffer& other) : Buffer(other.count_, other.dtype_, other.misalign_) {
    std::memcpy(data(), other.data(), count_ * dtype_size(dtype_));
  }
  Buffer& operator=(const Buffer& other) {
    if (this != &other) *this = Buffer(other);
    return *this;
  }
  Buffer(Buffer&&) = default;
  Buffer& operator=(Buffer&&) = default;
  // Whether nothing wrote outside the elements.
  bool canaries_intact() const {
    const std::size_t end = offset_ + count_ * dtype_size(dtype_);
    for (std::size_t i = 0; i < storage_.size(); ++i) {
      if ((i < offset_ || i >= end) && storage_[i] != kCanary) return false;
    }
    return true;
  }
  void* data() { return storage_.data() + offset_; }
  const void* data() const { return storage_.data() + offset_; }
  Dtype dtype() const { return dtype_; }
  float get(std::size_t i) const { return to_float(data(), dtype_, i); }
  void set(std::size_t i, float x) { from_float(data(), dtype_, i, x); }
  // The raw bytes of the elements, to compare buffers bit for bit.
  std::vector<unsigned char> bytes(std::size_t count) const {
    const auto* p = static_cast<const unsigned char*>(data());
    return {p, p + count * dtype_size(dtype_)};
  }

 private:
  Dtype dtype_ = Dtype::kFloat32;
  std::size_t count_ = 0;
  unsigned misalign_ = 0;
  std::vector<unsigned char> storage_;
  std::size_t offset_ = 0;
};

struct Layout {
  Dtype grad = Dtype::kFloat32;
  Dtype state = Dtype::kFloat32;
  std::optional<Dtype> copy;
  std::string name() const {
    return std::string("grad_") + dtype_name(grad) + "_state_" + dtype_name(state) + "_copy_" +
           (copy ? dtype_name(*copy) : "none");
  }
};

// Every dtype combination the kernels take: 3 gradient × 2 moment × 3 copy choices.
inline std::vector<Layout> all_layouts() {
  std::vector<Layout> layouts;
  for (Dtype g : {Dtype::kFloat32, Dtype::kBFloat16, Dtype::kFloat16}) {
    for (Dtype s : {Dtype::kFloat32, Dtype::kBFloat16}) {
      for (std::optional<Dtype> c : {std::optional<Dtype>{}, std::optional{Dtype::kBFloat16},
                                     std::optional{Dtype::kFloat16}}) {
        layouts.push_back({g, s, c});
      }
    }
  }
  return layouts;
}

// A subgroup's buffers with random contents.
struct Subgroup {
  Subgroup(std::size_t n, const Layout& l, std::mt19937_64& rng, unsigned misalign_seed = 0)
      : Subgroup(n, l, rng,
                 {misalign_seed % 16, (misalign_seed / 16) % 16, (misalign_seed / 7) % 16,
                  (misalign_seed / 3) % 16, (misalign_seed / 5) % 16}) {}
  // Each buffer (grad, param, exp_avg, exp_avg_sq, copy) `misalign[k]` elements past a 64-byte
  // boundary.
  Subgroup(std::size_t n, const Layout& l, std::mt19937_64& rng,
           const std::array<unsigned, 5>& misalign)
      : count(n),
        layout(l),
        grad(n, l.grad, misalign[0]),
        param(n, Dtype::kFloat32, misalign[1]),
        exp_avg(n, l.state, misalign[2]),
        exp_avg_sq(n, l.state, misalign[3]),
        copy(n, l.copy.value_or(Dtype::kBFloat16), misalign[4]) {
    fill(rng);
  }

  // Weights ~ N(0, 1), gradients ~ N(0, 1) (scaled, for the loss-scale tests), first moments
  // ~ N(0, 0.1), second moments in (1e-4, 1e-2): realistic magnitudes, never zero. The copy
  // starts as garbage, so that a missing write shows.
  void fill(std::mt19937_64& rng, float grad_scale = 1.0f) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> uniform(1e-4f, 1e-2f);
    auto nonzero = [&](float x) { return x == 0.0f ? 0.5f : x; };
    for (std::size_t i = 0; i < count; ++i) {
      grad.set(i, nonzero(normal(rng)) * grad_scale);
      param.set(i, nonzero(normal(rng)));
      exp_avg.set(i, nonzero(0.1f * normal(rng)));
      exp_avg_sq.set(i, uniform(rng));
      copy.set(i, 12345.0f);
    }
  }

  AdamSubgroup view() {
    AdamSubgroup s;
    s.grad = grad.data();
    s.param = static_cast<float*>(param.data());
    s.exp_avg = exp_avg.data();
    s.exp_avg_sq = exp_avg_sq.data();
    s.param_copy = layout.copy ? copy.data() : nullptr;
    s.count = count;
    s.grad_dtype = layout.grad;
    s.state_dtype = layout.state;
    s.copy_dtype = layout.copy.value_or(Dtype::kBFloat16);
    return s;
  }

  std::size_t count;
  Layout layout;
  Buffer grad, param, exp_avg, exp_avg_sq, copy;
};

// Random hyperparameters around the usual ones; every flag combination appears over a run.
inline AdamHyper random_hyper(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  AdamHyper h;
  h.lr = std::pow(10.0, -4.0 + 2.0 * unit(rng));
  h.beta1 = unit(rng) < 0.5 ? 0.9 : 0.8 + 0.19 * unit(rng);
  h.beta2 = unit(rng) < 0.5 ? 0.999 : 0.95 + 0.049 * unit(rng);
  h.eps = unit(rng) < 0.5 ? 1e-8 : 1e-6;
  h.weight_decay = unit(rng) < 0.3 ? 0.0 : 0.1 * unit(rng);
  h.step = 1 + static_cast<std::int64_t>(unit(rng) * 1000);
  h.decoupled = unit(rng) < 0.5;
  h.maximize = unit(rng) < 0.3;
  h.grad_scale = unit(rng) < 0.7 ? 1.0 : 1024.0;  // loss scales are powers of two
  return h;
}

inline std::string describe(const AdamHyper& h) {
  return "lr=" + std::to_string(h.lr) + " beta1=" + std::to_string(h.beta1) +
         " beta2=" + std::to_string(h.beta2) + " eps=" + std::to_string(h.eps) +
         " wd=" + std::to_string(h.weight_decay) + " step=" + std::to_string(h.step) +
         (h.decoupled ? " adamw" : " adam") + (h.maximize ? " maximize" : "") +
         " grad_scale=" + std::to_string(h.grad_scale);
}

struct Values {
  double p, m, v;
};

// The float64 reference: the textbook Adam/AdamW step (as torch.optim documents it), with no
// fp32 rounding anywhere.
// `m_bound`: 8-bit moments' clamp of the numerator's m to ±m_bound·√v (kernels/adam_math.h).
inline Values reference_step(const AdamHyper& h, double g, double p, double m, double v,
                             double m_bound = std::numeric_limits<double>::infinity()) {
  g /= h.grad_scale;
  if (h.maximize) g = -g;
  if (h.weight_decay != 0) {
    if (h.decoupled) {
      p *= 1 - h.lr * h.weight_decay;
    } else {
      g += h.weight_decay * p;
    }
  }
  m = h.beta1 * m + (1 - h.beta1) * g;
  v = h.beta2 * v + (1 - h.beta2) * g * g;
  const auto t = static_cast<double>(h.step);
  const double bc1 = 1 - std::pow(h.beta1, t);
  const double bc2 = 1 - std::pow(h.beta2, t);
  const double limit = std::isinf(m_bound) ? m_bound : m_bound * std::sqrt(v);
  const double numerator = std::clamp(m, -limit, limit);
  p -= h.lr / bc1 * numerator / (std::sqrt(v) / std::sqrt(bc2) + h.eps);
  return {p, m, v};
}

// Relative norm errors ‖out − ref‖ / ‖ref‖ of weights and moments, accumulated over as many
// elements as a test likes: one element's moment may legitimately lose digits to cancellation
// (m + w·(g − m) near zero), a norm over hundreds of elements may not.
struct ErrorNorms {
  double diff[3] = {0, 0, 0};
  double norm[3] = {0, 0, 0};
  std::size_t elements = 0;

  void add(const float out[3], const Values& ref) {
    const double r[3] = {ref.p, ref.m, ref.v};
    for (int k = 0; k < 3; ++k) {
      diff[k] += (out[k] - r[k]) * (out[k] - r[k]);
      norm[k] += r[k] * r[k];
    }
    ++elements;
  }
  double relative(int k) const { return std::sqrt(diff[k]) / std::sqrt(norm[k]); }
  void expect_within(double tolerance) const {
    if (elements == 0) return;
    EXPECT_LE(relative(0), tolerance) << "weights, over " << elements << " elements";
    EXPECT_LE(relative(1), tolerance) << "first moments, over " << elements << " elements";
    EXPECT_LE(relative(2), tolerance) << "second moments, over " << elements << " elements";
  }
};

struct Snapshot {
  std::vector<float> grad, p, m, v;
};

inline Snapshot snapshot(const Subgroup& s) {
  Snapshot x;
  for (std::size_t i = 0; i < s.count; ++i) {
    x.grad.push_back(s.grad.get(i));
    x.p.push_back(s.param.get(i));
    x.m.push_back(s.exp_avg.get(i));
    x.v.push_back(s.exp_avg_sq.get(i));
  }
  return x;
}

// Checks one step's outputs against the inputs in `before`:
//  - each output equal to the fp32 step of kernels/adam_math.h (HostMath), and each
//    low-precision output (bf16 moments, the copy) equal to the round-to-nearest-even cast of
//    that fp32 result;
//  - the fp32 weights and moments (the buffers' where fp32, else the fp32 results they round)
//    within 1e-6 relative norm of the float64 reference: checked here, or accumulated into
//    `norms` for the caller to check over more elements.
// Elements listed in `rejected` must be unchanged instead.
inline void expect_step(const AdamHyper& h, const Snapshot& before, const Subgroup& after,
                        const std::vector<bool>& rejected = {}, ErrorNorms* norms = nullptr) {
  const AdamCoefficients terms = adam_coefficients(h);
  ErrorNorms local;
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < after.count; ++i) {
    float p = before.p[i], m = before.m[i], v = before.v[i];
    const bool ok = adam_element<HostMath>(terms, before.grad[i], p, m, v);
    const bool expect_rejected = !rejected.empty() && rejected[i];
    EXPECT_EQ(ok, !expect_rejected) << "element " << i;
    // Bit-exact against the scalar formula (and through it, every variant against the others).
    auto same = [&](float expected, const Buffer& buffer) {
      switch (buffer.dtype()) {
        case Dtype::kFloat32: {
          const float got = buffer.get(i);
          // Bits, not values: -0 against +0 and NaN payloads count as differences here.
          // NOLINTNEXTLINE(bugprone-suspicious-memory-comparison)
          return std::memcmp(&got, &expected, sizeof got) == 0;
        }
        case Dtype::kBFloat16:
          return static_cast<const std::uint16_t*>(buffer.data())[i] == float_to_bf16(expected);
        case Dtype::kFloat16:
          return static_cast<const std::uint16_t*>(buffer.data())[i] == float_to_fp16(expected);
      }
      return false;
    };
    const bool exact = same(p, after.param) && same(m, after.exp_avg) &&
                       same(v, after.exp_avg_sq) && (!after.layout.copy || same(p, after.copy));
    if (!exact && ++mismatches <= 5) {
      ADD_FAILURE() << "element " << i << ": output differs from the fp32 formula (or its cast): "
                    << "p " << after.param.get(i) << " vs " << p << ", m " << after.exp_avg.get(i)
                    << " vs " << m << ", v " << after.exp_avg_sq.get(i) << " vs " << v;
    }
    if (expect_rejected) continue;
    const float out[3] = {after.param.get(i),
                          after.layout.state == Dtype::kFloat32 ? after.exp_avg.get(i) : m,
                          after.layout.state == Dtype::kFloat32 ? after.exp_avg_sq.get(i) : v};
    (norms != nullptr ? *norms : local)
        .add(out, reference_step(h, before.grad[i], before.p[i], before.m[i], before.v[i]));
  }
  EXPECT_EQ(mismatches, 0u);
  local.expect_within(1e-6);
}

}  // namespace tide::kernels::testing
