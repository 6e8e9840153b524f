// Stochastic rounding of bf16 moments (kernels/stochastic_round.h): the rounding is unbiased
// where round-to-nearest-even is not; every CPU variant and the CUDA kernel's source (compiled for
// the host) give the scalar loop's bits, which are the element-wise reference (adam_element, then
// float_to_bf16_stochastic with the hash of each element's global index); the bits do not depend
// on threads, chunks or the subgroup split, and change with the step and the seed; a second
// moment that moves by less than half a bf16 ulp a step tracks its fp32 value, where nearest
// rounding stalls it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/adam_kernel.h"
#include "kernels/adam_math.h"
#include "kernels/cpu_adam.h"
#include "kernels/dtype.h"
#include "kernels/host/grid.h"
#include "kernels/host_kernel.h"
#include "kernels/stochastic_round.h"
#include "tests/kernels/adam_test_util.h"

namespace tide::kernels::testing {
namespace {

constexpr Dtype kB = Dtype::kBFloat16;
constexpr Dtype kNoCopy = Dtype::kFloat32;  // no weight copy (fp32 is never a copy dtype)

// One subgroup with bf16 moments; the gradient of grad_dtype, the copy (if any) of copy_dtype.
struct SrState {
  Dtype grad_dtype = Dtype::kFloat32;
  Dtype copy_dtype = kNoCopy;
  std::vector<float> p, grad32;
  std::vector<std::uint16_t> grad16, m, v, copy;

  SrState(std::size_t n, Dtype g, Dtype c)
      : grad_dtype(g), copy_dtype(c), p(n), grad32(n), grad16(n), m(n), v(n), copy(n) {}
  std::size_t count() const { return p.size(); }
  void* grad() {
    return grad_dtype == Dtype::kFloat32 ? static_cast<void*>(grad32.data()) : grad16.data();
  }
  float grad_at(std::size_t i) const {
    return grad_dtype == Dtype::kFloat32 ? grad32[i] : to_float(grad16.data(), grad_dtype, i);
  }
  AdamSubgroup view(std::uint64_t rounding_index, std::size_t first = 0, std::size_t n = ~0ull) {
    if (n == ~0ull) n = count() - first;
    AdamSubgroup s;
    s.grad = grad_dtype == Dtype::kFloat32 ? static_cast<void*>(grad32.data() + first)
                                           : grad16.data() + first;
    s.param = p.data() + first;
    s.exp_avg = m.data() + first;
    s.exp_avg_sq = v.data() + first;
    s.param_copy = copy_dtype == kNoCopy ? nullptr : copy.data() + first;
    s.count = n;
    s.grad_dtype = grad_dtype;
    s.state_dtype = kB;
    s.copy_dtype = copy_dtype == kNoCopy ? kB : copy_dtype;
    s.moment_rounding = MomentRounding::kStochastic;
    s.rounding_index = rounding_index + first;
    return s;
  }
  bool operator==(const SrState& o) const {
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() &&
             (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    };
    return same(p, o.p) && m == o.m && v == o.v && copy == o.copy;
  }
};

SrState random_state(std::size_t n, Dtype g, Dtype c, std::mt19937_64& rng, bool poison) {
  SrState st(n, g, c);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t i = 0; i < n; ++i) {
    st.p[i] = normal(rng);
    from_float(st.grad(), g, i, normal(rng) * (i % 5 == 0 ? 1e-3f : 1.0f));
    st.m[i] = float_to_bf16(normal(rng) * 0.1f);
    st.v[i] = float_to_bf16(std::abs(normal(rng)) * 0.01f);
  }
  if (poison && n >= 3) {
    from_float(st.grad(), g, 0, std::numeric_limits<float>::quiet_NaN());
    from_float(st.grad(), g, n / 2, -std::numeric_limits<float>::infinity());
    st.v[n - 1] = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  }
  return st;
}

std::uint64_t cpu_step(const AdamSubgroup& s, const AdamHyper& h, CpuIsa isa,
                       unsigned threads = 1) {
  CpuAdamOptions o;
  o.force_isa = true;
  o.isa = isa;
  o.threads = threads;
  return cpu_adam_step(s, h, o).nonfinite;
}

// The CUDA kernel's source on the host, one subgroup in a grid of `grid_x` blocks of 64 threads.
std::uint64_t kernel_step(SrState& st, const AdamHyper& h, std::uint64_t rounding_index,
                          unsigned grid_x) {
  unsigned long long counter = 0;
  AdamKernelParams p{};
  p.terms = adam_coefficients(h);
  p.nonfinite = reinterpret_cast<std::uint64_t>(&counter);
  p.subgroup_count = 1;
  p.grad_dtype = st.grad_dtype;
  p.state_dtype = kB;
  p.has_copy = st.copy_dtype == kNoCopy ? 0 : 1;
  p.copy_dtype = st.copy_dtype == kNoCopy ? kB : st.copy_dtype;
  p.moment_rounding = MomentRounding::kStochastic;
  auto address = [](void* b) { return reinterpret_cast<std::uint64_t>(b); };
  AdamKernelSubgroup& s = p.subgroups[0];
  s.grad = address(st.grad());
  s.param = address(st.p.data());
  s.exp_avg = address(st.m.data());
  s.exp_avg_sq = address(st.v.data());
  s.param_copy = st.copy_dtype == kNoCopy ? 0 : address(st.copy.data());
  s.count = st.count();
  s.rounding_index = rounding_index;
  const HostKernelEntry* adam = find_host_kernel(kAdamKernel);
  EXPECT_NE(adam, nullptr);
  if (adam == nullptr) return 0;
  host::run_grid(HostGrid{{grid_x, 1, 1}, {64, 1, 1}, 0}, adam->thread, &p);
  return counter;
}

// The element-wise reference: the fp32 step, then each moment rounded with its element's bits
// computed from its full global index.
std::uint64_t reference_step(SrState& st, const AdamHyper& h, std::uint64_t rounding_index) {
  const AdamCoefficients t = adam_coefficients(h);
  const std::uint64_t key = rounding_step_key(h.rounding_seed, h.step);
  std::uint64_t rejected = 0;
  for (std::size_t i = 0; i < st.count(); ++i) {
    float p = st.p[i], m = bf16_to_float(st.m[i]), v = bf16_to_float(st.v[i]);
    if (!adam_element<HostMath>(t, st.grad_at(i), p, m, v)) ++rejected;
    const std::uint64_t index = rounding_index + i;
    const std::uint32_t bits =
        rounding_bits(rounding_span_key(key, index), static_cast<std::uint32_t>(index));
    st.p[i] = p;
    st.m[i] = float_to_bf16_stochastic(m, bits & 0xffffu);
    st.v[i] = float_to_bf16_stochastic(v, bits >> 16);
    if (st.copy_dtype == Dtype::kBFloat16) st.copy[i] = float_to_bf16(p);
    if (st.copy_dtype == Dtype::kFloat16) st.copy[i] = float_to_fp16(p);
  }
  return rejected;
}

TEST(AdamSrTest, RoundingIsUnbiasedWhereNearestIsNot) {
  // x = a + f·ulp(a) for bf16 values a of either sign and several magnitudes: the mean of its
  // stochastic roundings over 2^16 consecutive indices lands on x within 5 standard deviations
  // of the binomial mean (ulp·√(f(1−f)/N)); nearest rounding is off by min(f, 1 − f)·ulp.
  constexpr std::uint32_t kN = 1u << 16;
  const std::uint32_t key = rounding_span_key(rounding_step_key(12345, 7), 0);
  for (float a0 : {1.0f, -3.5f, 1e-20f, 6e4f, -2e-30f}) {
    const float a = bf16_to_float(float_to_bf16(a0));
    for (double f : {0.1, 0.25, 0.3, 0.5, 0.75, 0.97}) {
      const float ulp =
          std::abs(bf16_to_float(static_cast<std::uint16_t>(float_to_bf16(a) + 1)) - a);
      const auto x = static_cast<float>(a + std::copysign(f * ulp, a));
      double sum = 0.0;
      for (std::uint32_t i = 0; i < kN; ++i) {
        const std::uint32_t bits = rounding_bits(key, i);
        const float r =
            bf16_to_float(float_to_bf16_stochastic(x, (i % 2 ? bits >> 16 : bits) & 0xffffu));
        ASSERT_TRUE(r == a || r == static_cast<float>(a + std::copysign(ulp, a))) << x << " " << r;
        sum += r;
      }
      const double mean = sum / kN;
      const double sigma = ulp * std::sqrt(f * (1 - f) / kN);
      EXPECT_LE(std::abs(mean - x), 5 * sigma) << "a=" << a << " f=" << f;
      const double nearest_error = std::abs(bf16_to_float(float_to_bf16(x)) - double{x});
      EXPECT_GE(nearest_error, std::min(f, 1 - f) * ulp * 0.99) << "a=" << a << " f=" << f;
      EXPECT_GT(nearest_error, 20 * sigma) << "a=" << a << " f=" << f;
    }
  }
  // bf16 values never move; NaN stays NaN (quiet), infinities stay infinite.
  for (std::uint32_t r : {0u, 1u, 0x7fffu, 0xffffu}) {
    for (float exact : {0.0f, -0.0f, 1.0f, -3.5f, 1e-40f}) {
      const float e = bf16_to_float(float_to_bf16(exact));
      EXPECT_EQ(float_bits(bf16_to_float(float_to_bf16_stochastic(e, r))), float_bits(e));
    }
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(bf16_to_float(float_to_bf16_stochastic(inf, r)), inf);
    EXPECT_EQ(bf16_to_float(float_to_bf16_stochastic(-inf, r)), -inf);
    EXPECT_EQ(float_to_bf16_stochastic(std::numeric_limits<float>::quiet_NaN(), r),
              float_to_bf16(std::numeric_limits<float>::quiet_NaN()));
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16_stochastic(bits_float(0x7f800001u), r))));
  }
}

TEST(AdamSrTest, EveryVariantAndTheKernelSourceEqualTheElementwiseReference) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 70; ++n) lengths.push_back(n);
  lengths.push_back(40003);
  // Global indices from 0, from an odd offset, and across a 2^32 boundary (a new span key).
  const std::uint64_t kIndices[] = {0, 1234567, (std::uint64_t{5} << 32) - 20011};
  for (Dtype g : {Dtype::kFloat32, Dtype::kBFloat16, Dtype::kFloat16}) {
    for (Dtype c : {kNoCopy, Dtype::kBFloat16, Dtype::kFloat16}) {
      SCOPED_TRACE(std::string("grad ") + dtype_name(g) + ", copy " + dtype_name(c));
      AdamHyper h = random_hyper(rng);
      h.rounding_seed = rng();
      SCOPED_TRACE(describe(h));
      for (std::size_t n : lengths) {
        const std::uint64_t index = kIndices[n % 3];
        SCOPED_TRACE(std::to_string(n) + " elements from index " + std::to_string(index));
        const SrState before = random_state(n, g, c, rng, n % 2 == 1);
        SrState reference = before;
        const std::uint64_t rejected = reference_step(reference, h, index);
        for (CpuIsa isa : supported_isas()) {
          SrState other = before;
          EXPECT_EQ(cpu_step(other.view(index), h, isa), rejected) << isa_name(isa);
          EXPECT_TRUE(other == reference) << isa_name(isa);
        }
        for (unsigned grid_x : {1u, 7u}) {
          SrState kernel = before;
          EXPECT_EQ(kernel_step(kernel, h, index, grid_x), rejected) << "grid " << grid_x;
          EXPECT_TRUE(kernel == reference) << "the kernel source, grid " << grid_x;
        }
        if (n % 2 == 1 && n >= 3) {
          EXPECT_GE(rejected, 2u);
        }
        if (HasFailure()) return;
      }
    }
  }
}

TEST(AdamSrTest, BitsDoNotDependOnThreadsOrSubgroupSplitAndChangeWithStepAndSeed) {
  std::mt19937_64 rng(fresh_seed());
  // Several of cpu_adam's chunks (2^18 elements), so that threads take different chunks.
  const std::size_t n = 3 * (std::size_t{1} << 18) + 4321;
  const std::uint64_t index = 987654321;
  AdamHyper h;
  h.step = 17;
  h.rounding_seed = 42;
  const SrState before = random_state(n, Dtype::kBFloat16, Dtype::kBFloat16, rng, false);
  const CpuIsa best = best_cpu_isa();
  SrState whole = before;
  cpu_step(whole.view(index), h, best, 1);
  for (unsigned threads : {2u, 3u, 4u}) {
    SrState other = before;
    cpu_step(other.view(index), h, best, threads);
    EXPECT_TRUE(other == whole) << threads << " threads";
  }
  // Two subgroups cut at odd places, each with its elements' global indices, on other variants.
  for (std::size_t cut : {std::size_t{1}, std::size_t{100003}, n - 5}) {
    SrState split = before;
    cpu_step(split.view(index, 0, cut), h, CpuIsa::kScalar);
    cpu_step(split.view(index, cut), h, supported_isas().back(), 2);
    EXPECT_TRUE(split == whole) << "cut at " << cut;
  }
  // Another step or seed rounds differently (and the same ones the same).
  auto differing = [&](const AdamHyper& other_h) {
    SrState other = before;
    cpu_step(other.view(index), other_h, best, 2);
    std::size_t d = 0;
    for (std::size_t i = 0; i < n; ++i) d += other.v[i] != whole.v[i] || other.m[i] != whole.m[i];
    return d;
  };
  EXPECT_EQ(differing(h), 0u);
  AdamHyper next_seed = h;
  next_seed.rounding_seed = 43;
  EXPECT_GT(differing(next_seed), n / 10);
  // The step also changes the update (its bias corrections); its key differs like the seed's.
  EXPECT_NE(rounding_step_key(42, 17), rounding_step_key(42, 18));
  EXPECT_NE(rounding_step_key(42, 17), rounding_step_key(43, 17));
}

TEST(AdamSrTest, SecondMomentTracksFp32WhereNearestStalls) {
  // A constant gradient g with β2 = 0.999: v_t = (1 − β2^t)·g². Past a few hundred steps v moves
  // by less than half a bf16 ulp a step; nearest rounding then keeps it where it is, stochastic
  // rounding keeps it right on average. lr 0: the weights do not change, only the moments.
  const std::size_t n = 4096;
  const int steps = 3000;
  std::vector<float> p(n, 1.0f), grad(n);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> unit(0.5f, 2.0f);
  for (float& g : grad) g = unit(rng);
  auto run = [&](MomentRounding rounding) {
    std::vector<std::uint16_t> m(n, 0), v(n, 0);
    AdamSubgroup s;
    s.grad = grad.data();
    s.param = p.data();
    s.exp_avg = m.data();
    s.exp_avg_sq = v.data();
    s.count = n;
    s.state_dtype = kB;
    s.moment_rounding = rounding;
    AdamHyper h;
    h.lr = 0.0;
    h.rounding_seed = 3;
    for (int t = 1; t <= steps; ++t) {
      h.step = t;
      cpu_adam_step(s, h);
    }
    // The mean relative error of v against float64's.
    const double exact = 1.0 - std::pow(0.999, steps);
    double error = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      const double g2 = double{grad[i]} * grad[i];
      error += (bf16_to_float(v[i]) - exact * g2) / (exact * g2);
    }
    return error / n;
  };
  const double nearest = run(MomentRounding::kNearest);
  const double stochastic = run(MomentRounding::kStochastic);
  RecordProperty("nearest_v_error", std::to_string(nearest));
  RecordProperty("stochastic_v_error", std::to_string(stochastic));
  EXPECT_LT(std::abs(stochastic), 0.005) << "nearest: " << nearest;
  EXPECT_GT(std::abs(nearest), 0.05) << "stochastic: " << stochastic;
}

TEST(AdamSrTest, MisuseIsRefused) {
  std::vector<float> p(8), g(8), m32(8), v32(8);
  std::vector<std::uint16_t> w(8), c(8), m16(8), v16(8);
  AdamSubgroup s;
  s.grad = g.data();
  s.param = p.data();
  s.exp_avg = m32.data();
  s.exp_avg_sq = v32.data();
  s.count = 8;
  s.moment_rounding = MomentRounding::kStochastic;
  EXPECT_THROW(cpu_adam_step(s, AdamHyper{}), std::invalid_argument);  // fp32 moments
  s.state_format = StateFormat::kBlockQ8;
  EXPECT_THROW(cpu_adam_step(s, AdamHyper{}), std::invalid_argument);  // 8-bit moments
  s.state_format = StateFormat::kDtype;
  s.state_dtype = kB;
  s.exp_avg = m16.data();
  s.exp_avg_sq = v16.data();
  s.param = nullptr;
  s.master_dtype = kB;
  s.param_bf16 = w.data();
  s.param_comp = c.data();
  EXPECT_THROW(cpu_adam_step(s, AdamHyper{}), std::invalid_argument);  // bf16 master
  s.master_dtype = Dtype::kFloat32;
  s.param = p.data();
  s.moment_rounding = static_cast<MomentRounding>(7);
  EXPECT_THROW(cpu_adam_step(s, AdamHyper{}), std::invalid_argument);
  s.moment_rounding = MomentRounding::kStochastic;
  EXPECT_NO_THROW(cpu_adam_step(s, AdamHyper{}));
}

}  // namespace
}  // namespace tide::kernels::testing
