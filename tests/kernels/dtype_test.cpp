// kernels/dtype.h's conversions against independent references: bf16 by choosing the nearer
// of the two neighbouring bf16 values in double arithmetic (ties to the even one), fp16 against
// the CPU's own F16C conversion where it has one, and against exact arithmetic otherwise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tide::kernels {
namespace {

bool is_nan_bits(std::uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

// Round-to-nearest-even to bf16 by comparing distances, in double (exact for these values).
std::uint16_t bf16_reference(float f) {
  const std::uint32_t u = float_bits(f);
  const auto down = static_cast<std::uint16_t>(u >> 16);  // truncation, toward zero
  if ((u & 0xffffu) == 0) return down;
  const auto up = static_cast<std::uint16_t>(down + 1);  // next away from zero (may be inf)
  const double x = std::fabs(static_cast<double>(f));
  const double lo = std::fabs(static_cast<double>(bf16_to_float(down)));
  // The value past the largest finite bf16 rounds to infinity at the halfway point of an
  // imaginary next binade step, which bf16_to_float(up) = inf gives only as a limit.
  const double hi = (up & 0x7fffu) == 0x7f80u ? std::ldexp(1.0, 128)
                                              : std::fabs(static_cast<double>(bf16_to_float(up)));
  if (x - lo < hi - x) return down;
  if (x - lo > hi - x) return up;
  return (down & 1u) ? up : down;
}

// The low 16-bit patterns that matter for rounding: exact, just below/at/above half, max.
const std::uint32_t kLowPatterns[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};

TEST(DtypeTest, Bf16RoundsToNearestEvenForEveryHighHalf) {
  std::mt19937 rng(std::random_device{}());
  for (std::uint32_t high = 0; high < 0x10000u; ++high) {
    for (std::uint32_t low : kLowPatterns) {
      const std::uint32_t u = (high << 16) | low;
      const float f = bits_float(u);
      const std::uint16_t got = float_to_bf16(f);
      if (is_nan_bits(u)) {
        ASSERT_TRUE(std::isnan(bf16_to_float(got))) << std::hex << u;
        ASSERT_EQ(got & 0x8000u, (u >> 16) & 0x8000u) << "NaN keeps its sign " << std::hex << u;
        continue;
      }
      ASSERT_EQ(got, bf16_reference(f)) << std::hex << "bits " << u;
    }
    const std::uint32_t u = (high << 16) | (rng() & 0xffffu);
    if (!is_nan_bits(u)) {
      ASSERT_EQ(float_to_bf16(bits_float(u)), bf16_reference(bits_float(u)));
    }
  }
}

TEST(DtypeTest, Bf16RoundTripsExactly) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    if (is_nan_bits(h << 16)) continue;
    ASSERT_EQ(float_to_bf16(bf16_to_float(static_cast<std::uint16_t>(h))), h) << std::hex << h;
  }
}

// fp16 → fp32 is exact: check every fp16 value against ldexp arithmetic.
TEST(DtypeTest, Fp16ToFloatIsExactForEveryValue) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const float got = fp16_to_float(static_cast<std::uint16_t>(h));
    const bool negative = (h & 0x8000u) != 0;
    const unsigned exponent = (h >> 10) & 0x1fu;
    const unsigned mantissa = h & 0x3ffu;
    double want;
    if (exponent == 0x1f) {
      if (mantissa != 0) {
        ASSERT_TRUE(std::isnan(got)) << std::hex << h;
        continue;
      }
      want = std::numeric_limits<double>::infinity();
    } else if (exponent == 0) {
      want = std::ldexp(static_cast<double>(mantissa), -24);
    } else {
      want = std::ldexp(static_cast<double>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
    }
    if (negative) want = -want;
    ASSERT_EQ(static_cast<double>(got), want) << std::hex << h;
    ASSERT_EQ(std::signbit(got), negative) << std::hex << h;
    ASSERT_EQ(float_to_fp16(got), h) << "round trip " << std::hex << h;
  }
}

// Round-to-nearest-even to fp16 in exact arithmetic: the two fp16 neighbours of |f|.
std::uint16_t fp16_reference(float f) {
  const double x = std::fabs(static_cast<double>(f));
  const std::uint16_t sign = std::signbit(f) ? 0x8000u : 0u;
  if (std::isinf(f)) return sign | 0x7c00u;
  // Neighbours by bisection over the ordered magnitudes 0..0x7c00 (inf).
  std::uint16_t lo = 0, hi = 0x7c00;
  while (hi - lo > 1) {
    const auto mid = static_cast<std::uint16_t>((lo + hi) / 2);
    if (static_cast<double>(fp16_to_float(mid)) <= x) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const double vlo = fp16_to_float(lo);
  if (vlo == x) return sign | lo;
  // Past the largest finite value, "hi" is infinity, reached at 65520 (the halfway point).
  const double vhi = hi == 0x7c00 ? 65536.0 : static_cast<double>(fp16_to_float(hi));
  if (x - vlo < vhi - x) return sign | lo;
  if (x - vlo > vhi - x) return sign | hi;
  return sign | ((lo & 1u) ? hi : lo);
}

#if defined(__x86_64__)
// The CPU's own conversion, as a second, independent reference.
__attribute__((target("f16c"))) std::uint16_t f16c_convert(float f) {
  return static_cast<std::uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
#endif

TEST(DtypeTest, Fp16RoundsToNearestEven) {
#if defined(__x86_64__)
  const bool has_f16c = __builtin_cpu_supports("f16c");
#endif
  std::mt19937 rng(std::random_device{}());
  std::vector<std::uint32_t> patterns;
  // Every exponent from far below fp16's subnormals to far above its maximum, with the low
  // 13 bits (what fp16 drops from a normal) at every rounding case, and random mantissas.
  for (std::uint32_t sign : {0u, 0x80000000u}) {
    for (std::uint32_t exponent = 90; exponent <= 150; ++exponent) {
      for (std::uint32_t k = 0; k < 512; ++k) {
        const std::uint32_t mantissa =
            k < 256 ? (k << 15) | (k & 1 ? 0x1000u : 0x0fffu) : rng() & 0x7fffffu;
        patterns.push_back(sign | (exponent << 23) | mantissa);
      }
      for (std::uint32_t low : {0x0000u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu, 0x2000u, 0x3000u}) {
        patterns.push_back(sign | (exponent << 23) | low);
      }
    }
  }
  for (int i = 0; i < 100000; ++i) patterns.push_back(static_cast<std::uint32_t>(rng()));
  for (std::uint32_t u : patterns) {
    const float f = bits_float(u);
    const std::uint16_t got = float_to_fp16(f);
    if (is_nan_bits(u)) {
      ASSERT_TRUE(std::isnan(fp16_to_float(got))) << std::hex << u;
      continue;
    }
    ASSERT_EQ(got, fp16_reference(f)) << std::hex << "bits " << u;
#if defined(__x86_64__)
    if (has_f16c) {
      ASSERT_EQ(got, f16c_convert(f)) << std::hex << "bits " << u;
    }
#endif
  }
}

TEST(DtypeTest, NaNStaysNaNAndInfinityStaysInfinite) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_bf16(inf), 0x7f80u);
  EXPECT_EQ(float_to_bf16(-inf), 0xff80u);
  EXPECT_EQ(float_to_fp16(inf), 0x7c00u);
  EXPECT_EQ(float_to_fp16(-inf), 0xfc00u);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00u);  // halfway past the largest: ties to inf (even)
  EXPECT_EQ(float_to_fp16(65519.996f), 0x7bffu);
  // A signalling NaN whose payload sits in the dropped bits must not become infinity.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(bits_float(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(bits_float(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(bits_float(0xff800001u)))));
}

}  // namespace
}  // namespace tide::kernels
