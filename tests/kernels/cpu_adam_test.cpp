// The CPU Adam kernels, each instruction set explicitly: against the float64 reference on fresh
// random data, for every dtype combination, lengths around the vector widths and unaligned
// buffers; agreement of the variants bit for bit; non-finite gradients.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu_adam.h"
#include "kernels/cpu_variant.h"
#include "tests/kernels/adam_test_util.h"

namespace tide::kernels {
// Test names and messages show the instruction set's name.
inline void PrintTo(CpuIsa isa, std::ostream* os) { *os << isa_name(isa); }
}  // namespace tide::kernels

namespace tide::kernels::testing {
namespace {

// Lengths below, at and around the vector widths (8, 16) and their multiples, and one that
// spans several thread chunks.
const std::size_t kLengths[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 257, 1000, 4099};

class CpuAdamIsaTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (!cpu_supports(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run " << isa_name(GetParam());
    }
  }
  CpuAdamOptions options() const {
    CpuAdamOptions o;
    o.force_isa = true;
    o.isa = GetParam();
    o.threads = 1;
    return o;
  }
};

TEST_P(CpuAdamIsaTest, MatchesTheFloat64ReferenceForEveryDtypeLengthAndAlignment) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  unsigned misalign = 0;
  for (const Layout& layout : all_layouts()) {
    ErrorNorms norms;  // over all lengths of this layout
    for (std::size_t n : kLengths) {
      const AdamHyper h = random_hyper(rng);
      SCOPED_TRACE(layout.name() + " n=" + std::to_string(n) + " " + describe(h));
      Subgroup s(n, layout, rng, misalign++);
      s.fill(rng, static_cast<float>(h.grad_scale));
      const Snapshot before = snapshot(s);
      const AdamResult result = cpu_adam_step(s.view(), h, options());
      EXPECT_EQ(result.nonfinite, 0u);
      EXPECT_TRUE(result.applied);
      expect_step(h, before, s, {}, &norms);
      if (HasFailure()) return;
    }
    SCOPED_TRACE(layout.name());
    norms.expect_within(1e-6);
  }
}

TEST_P(CpuAdamIsaTest, HyperparametersMayChangeEveryStep) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Subgroup s(777, {Dtype::kBFloat16, Dtype::kFloat32, Dtype::kBFloat16}, rng, 3);
  AdamHyper h;
  for (int step = 1; step <= 20; ++step) {
    h.step = step;
    h.lr = 1e-3 * (1.0 + std::cos(step * 0.3));  // a schedule
    h.weight_decay = step % 2 ? 0.01 : 0.0;
    h.decoupled = step % 3 != 0;
    std::normal_distribution<float> normal;
    for (std::size_t i = 0; i < s.count; ++i) s.grad.set(i, normal(rng));
    const Snapshot before = snapshot(s);
    cpu_adam_step(s.view(), h, options());
    expect_step(h, before, s);
  }
}

TEST_P(CpuAdamIsaTest, AgreesBitForBitWithTheScalarVariant) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const Layout& layout : all_layouts()) {
    SCOPED_TRACE(layout.name());
    std::mt19937_64 rng_a(seed), rng_b(seed);
    Subgroup a(1021, layout, rng_a, 5);
    Subgroup b(1021, layout, rng_b, 5);
    std::mt19937_64 rng_h(seed);
    const AdamHyper h = random_hyper(rng_h);
    cpu_adam_step(a.view(), h, options());
    CpuAdamOptions scalar = options();
    scalar.isa = CpuIsa::kScalar;
    cpu_adam_step(b.view(), h, scalar);
    EXPECT_EQ(a.param.bytes(a.count), b.param.bytes(b.count));
    EXPECT_EQ(a.exp_avg.bytes(a.count), b.exp_avg.bytes(b.count));
    EXPECT_EQ(a.exp_avg_sq.bytes(a.count), b.exp_avg_sq.bytes(b.count));
    if (layout.copy) {
      EXPECT_EQ(a.copy.bytes(a.count), b.copy.bytes(b.count));
    }
  }
}

// The bf16 stores' hard cases, each variant against the scalar one bit for bit: denormal
// moments (a moment decaying through the denormals: VCVTNEPS2BF16 would flush them to zero, so
// the avx512bf16 variant must round those vectors with integer operations), and, with lr = 0 so
// that the weights pass to the copy unchanged, weights that are denormal, exact ties, and just
// below fp32's maximum (rounding to bf16's infinity). Every vector of 16 holds a few of each.
TEST_P(CpuAdamIsaTest, StoresDenormalsTiesAndOverflowsAsTheScalarVariantDoes) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const Layout& layout : all_layouts()) {
    SCOPED_TRACE(layout.name());
    std::mt19937_64 rng(seed);
    Subgroup a(1021, layout, rng, 7);
    for (std::size_t i = 0; i < a.count; ++i) {
      const auto r = static_cast<std::uint32_t>(rng());
      const std::uint32_t sign = r & 0x80000000u;
      const std::uint32_t denormal = sign | ((r >> 7) & 0x007fffffu);
      switch (i % 5) {
        case 0:  // denormal moments, no gradient: both stay denormal
          a.grad.set(i, 0.0f);
          a.exp_avg.set(i, bits_float(denormal));
          a.exp_avg_sq.set(i, bits_float(denormal & 0x7fffffffu));
          a.param.set(i, bits_float(denormal));
          break;
        case 1:  // a tie: halfway between two bf16 values, odd or even below
          a.param.set(i, bits_float(sign | (r & 0x7e7f0000u) | 0x8000u));
          break;
        case 2:  // at or above bf16's largest value's halfway point: rounds to infinity
          a.param.set(i, bits_float(sign | 0x7f7f8000u | (r & 0x7fffu)));
          break;
        case 3:  // a denormal weight with an ordinary moment
          a.param.set(i, bits_float(denormal));
          break;
        default:  // random bits of a finite value
          a.param.set(i, bits_float(r & 0xfe7fffffu));
          break;
      }
    }
    Subgroup b = a;
    AdamHyper h;
    h.step = 3;
    for (double lr : {0.0, 1e-3}) {
      h.lr = lr;
      cpu_adam_step(a.view(), h, options());
      CpuAdamOptions scalar = options();
      scalar.isa = CpuIsa::kScalar;
      cpu_adam_step(b.view(), h, scalar);
      SCOPED_TRACE("lr " + std::to_string(lr));
      EXPECT_EQ(a.param.bytes(a.count), b.param.bytes(b.count));
      EXPECT_EQ(a.exp_avg.bytes(a.count), b.exp_avg.bytes(b.count));
      EXPECT_EQ(a.exp_avg_sq.bytes(a.count), b.exp_avg_sq.bytes(b.count));
      if (layout.copy) {
        EXPECT_EQ(a.copy.bytes(a.count), b.copy.bytes(b.count));
      }
      if (HasFailure()) return;
    }
  }
}

// Non-finite gradients (±inf, NaN) and an update that overflows: those elements keep their
// weights, moments and copy (the cast of the unchanged weight); the others are updated; the
// result counts them.
TEST_P(CpuAdamIsaTest, NonFiniteElementsAreCountedAndLeftUnchanged) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  for (const Layout& layout : all_layouts()) {
    SCOPED_TRACE(layout.name());
    Subgroup s(531, layout, rng, 9);
    std::vector<bool> rejected(s.count, false);
    std::uniform_int_distribution<std::size_t> pick(0, s.count - 1);
    std::uint64_t expected = 0;
    for (int k = 0; k < 20; ++k) {
      const std::size_t i = pick(rng);
      if (rejected[i]) continue;
      rejected[i] = true;
      ++expected;
      s.grad.set(i, specials[k % 3]);
    }
    if (layout.grad == Dtype::kFloat32) {
      // Finite, but its square overflows the second moment.
      std::size_t i = pick(rng);
      while (rejected[i]) i = pick(rng);
      rejected[i] = true;
      ++expected;
      s.grad.set(i, 3e38f);
    }
    AdamHyper h;
    h.step = 5;
    const Snapshot before = snapshot(s);
    const AdamResult result = cpu_adam_step(s.view(), h, options());
    EXPECT_EQ(result.nonfinite, expected);
    EXPECT_TRUE(result.applied);
    expect_step(h, before, s, rejected);
    for (std::size_t i = 0; i < s.count; ++i) {
      ASSERT_TRUE(std::isfinite(s.param.get(i))) << i;
      ASSERT_TRUE(std::isfinite(s.exp_avg.get(i))) << i;
      ASSERT_TRUE(std::isfinite(s.exp_avg_sq.get(i))) << i;
    }
  }
}

TEST_P(CpuAdamIsaTest, SkipSubgroupWritesNothingWhenAGradientIsNonFinite) {
  std::mt19937_64 rng(fresh_seed());
  for (Dtype g : {Dtype::kFloat32, Dtype::kBFloat16, Dtype::kFloat16}) {
    Subgroup s(300, {g, Dtype::kFloat32, Dtype::kBFloat16}, rng, 1);
    s.grad.set(123, std::numeric_limits<float>::quiet_NaN());
    s.grad.set(299, -std::numeric_limits<float>::infinity());
    const auto p = s.param.bytes(s.count), m = s.exp_avg.bytes(s.count),
               v = s.exp_avg_sq.bytes(s.count), c = s.copy.bytes(s.count);
    CpuAdamOptions o = options();
    o.skip_subgroup_on_nonfinite = true;
    const AdamResult result = cpu_adam_step(s.view(), AdamHyper{}, o);
    EXPECT_FALSE(result.applied);
    EXPECT_EQ(result.nonfinite, 2u);
    EXPECT_EQ(s.param.bytes(s.count), p);
    EXPECT_EQ(s.exp_avg.bytes(s.count), m);
    EXPECT_EQ(s.exp_avg_sq.bytes(s.count), v);
    EXPECT_EQ(s.copy.bytes(s.count), c);
    // Finite gradients: the step applies as usual.
    s.grad.set(123, 1.0f);
    s.grad.set(299, -1.0f);
    const Snapshot before = snapshot(s);
    const AdamResult ok = cpu_adam_step(s.view(), AdamHyper{}, o);
    EXPECT_TRUE(ok.applied);
    EXPECT_EQ(ok.nonfinite, 0u);
    expect_step(AdamHyper{}, before, s);
  }
}

TEST_P(CpuAdamIsaTest, CountsNonFiniteValuesOfEveryDtype) {
  std::mt19937_64 rng(fresh_seed());
  for (Dtype d : {Dtype::kFloat32, Dtype::kBFloat16, Dtype::kFloat16}) {
    for (std::size_t n : kLengths) {
      Buffer b(n, d, static_cast<unsigned>(n % 16));
      std::normal_distribution<float> normal;
      for (std::size_t i = 0; i < n; ++i) b.set(i, normal(rng));
      std::uint64_t expected = 0;
      for (std::size_t i = 0; i < n; i += 1 + rng() % 13) {
        b.set(i, i % 2 ? std::numeric_limits<float>::infinity()
                       : std::numeric_limits<float>::quiet_NaN());
        ++expected;
      }
      EXPECT_EQ(cpu_count_nonfinite(b.data(), d, n, options()), expected)
          << dtype_name(d) << " n=" << n;
    }
  }
}

// The vector conversions must give dtype.h's bits for every value: all 65536 high halves
// with the low bits at each rounding case (exact, below/at/above half), and random patterns.
TEST_P(CpuAdamIsaTest, CastRoundsExactlyAsDtypeH) {
  std::mt19937_64 rng(fresh_seed());
  std::vector<float> src;
  for (std::uint32_t high = 0; high < 0x10000u; ++high) {
    for (std::uint32_t low :
         {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      src.push_back(bits_float((high << 16) | low));
    }
    src.push_back(bits_float((high << 16) | static_cast<std::uint32_t>(rng() & 0xffffu)));
  }
  for (Dtype d : {Dtype::kBFloat16, Dtype::kFloat16}) {
    std::vector<std::uint16_t> out(src.size());
    cpu_cast(src.data(), out.data(), d, src.size(), options());
    for (std::size_t i = 0; i < src.size(); ++i) {
      const std::uint16_t want =
          d == Dtype::kBFloat16 ? float_to_bf16(src[i]) : float_to_fp16(src[i]);
      ASSERT_EQ(out[i], want) << dtype_name(d) << std::hex << " bits " << float_bits(src[i]);
    }
    // Any length, any alignment: nothing written outside.
    for (std::size_t n : kLengths) {
      std::vector<std::uint16_t> part(n + 2, 0xdead);
      cpu_cast(src.data() + 3, part.data() + 1, d, n, options());
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(part[1 + i], out[3 + i]) << n;
      EXPECT_EQ(part[0], 0xdead);
      EXPECT_EQ(part[n + 1], 0xdead);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, CpuAdamIsaTest, ::testing::ValuesIn(kCpuIsas),
                         [](const ::testing::TestParamInfo<CpuIsa>& p) {
                           return std::string(isa_name(p.param));
                         });

TEST(CpuAdamTest, TheDefaultIsTheWidestSupportedInstructionSet) {
  EXPECT_TRUE(cpu_supports(CpuIsa::kScalar));
  const CpuIsa best = best_cpu_isa();
  EXPECT_TRUE(cpu_supports(best));
  if (cpu_supports(CpuIsa::kAvx512Bf16)) {
    EXPECT_EQ(best, CpuIsa::kAvx512Bf16);
  } else if (cpu_supports(CpuIsa::kAvx512)) {
    EXPECT_EQ(best, CpuIsa::kAvx512);
  }
  EXPECT_EQ(cpu_kernels(best).isa, best);
}

TEST(CpuAdamTest, RejectsBadArguments) {
  std::mt19937_64 rng(fresh_seed());
  Subgroup s(10, {Dtype::kFloat32, Dtype::kFloat32, {}}, rng);
  AdamSubgroup v = s.view();
  v.state_dtype = Dtype::kFloat16;
  EXPECT_THROW(cpu_adam_step(v, AdamHyper{}), std::invalid_argument);
  v = s.view();
  v.exp_avg = nullptr;
  EXPECT_THROW(cpu_adam_step(v, AdamHyper{}), std::invalid_argument);
  v = s.view();
  v.param = reinterpret_cast<float*>(reinterpret_cast<char*>(v.param) + 1);
  EXPECT_THROW(cpu_adam_step(v, AdamHyper{}), std::invalid_argument);
  v = s.view();
  v.grad_dtype = static_cast<Dtype>(7);
  EXPECT_THROW(cpu_adam_step(v, AdamHyper{}), std::invalid_argument);
  v = s.view();
  v.param_copy = s.copy.data();
  v.copy_dtype = Dtype::kFloat32;
  EXPECT_THROW(cpu_adam_step(v, AdamHyper{}), std::invalid_argument);
  for (auto bad : {&AdamHyper::lr, &AdamHyper::beta1, &AdamHyper::beta2, &AdamHyper::eps,
                   &AdamHyper::weight_decay, &AdamHyper::grad_scale}) {
    AdamHyper h;
    h.*bad = -1;
    EXPECT_THROW(cpu_adam_step(s.view(), h), std::invalid_argument);
  }
  AdamHyper h;
  h.step = 0;
  EXPECT_THROW(cpu_adam_step(s.view(), h), std::invalid_argument);
  h = AdamHyper{};
  h.beta1 = 1.0;
  EXPECT_THROW(cpu_adam_step(s.view(), h), std::invalid_argument);
  // Nothing is required of an empty subgroup but valid dtypes.
  AdamSubgroup empty;
  EXPECT_EQ(cpu_adam_step(empty, AdamHyper{}).nonfinite, 0u);
}

// A process forked after the pool started (e.g. a data-loader worker) has none of its worker
// threads: its steps must run on the calling thread, not wait for the missing workers.
TEST(CpuAdamTest, AForkedChildStepsWithoutThePoolsWorkers) {
  std::mt19937_64 rng(fresh_seed());
  Subgroup s((std::size_t{1} << 18) * 3, {Dtype::kFloat32, Dtype::kFloat32, {}}, rng);
  CpuAdamOptions two;
  two.threads = 2;
  cpu_adam_step(s.view(), AdamHyper{}, two);  // starts the pool
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const Snapshot before = snapshot(s);
    AdamHyper h;
    h.step = 2;
    cpu_adam_step(s.view(), h, two);
    const bool changed = s.param.get(0) != before.p[0];
    ::_exit(changed ? 0 : 1);
  }
  int status = 0;
  bool exited = false;
  for (int waited_ms = 0; waited_ms < 20000 && !exited; waited_ms += 10) {
    exited = ::waitpid(child, &status, WNOHANG) == child;
    if (!exited) ::usleep(10000);
  }
  if (!exited) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    FAIL() << "the forked child hung";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// PyTorch's lerp switches formula at weight 0.5: with beta1 <= 0.5 the first moment is
// fma(w - 1, g - m, g), which the float64 reference must still agree with.
TEST(CpuAdamTest, SmallBeta1UsesTheOtherLerpFormula) {
  std::mt19937_64 rng(fresh_seed());
  for (double beta1 : {0.0, 0.3, 0.5}) {
    AdamHyper h;
    h.beta1 = beta1;
    h.step = 3;
    EXPECT_TRUE(adam_coefficients(h).lerp_from_grad);
    Subgroup s(100, {Dtype::kFloat32, Dtype::kFloat32, {}}, rng);
    const Snapshot before = snapshot(s);
    cpu_adam_step(s.view(), h);
    expect_step(h, before, s);
  }
}

}  // namespace
}  // namespace tide::kernels::testing
