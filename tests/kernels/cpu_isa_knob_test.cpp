// TIDE_CPU_ISA picks the CPU kernels' instruction set: auto (the widest),
// avx512bf16, avx512, avx2 or scalar.
// A value it does not accept, or one this CPU cannot run, is an error naming the knob. In a
// process of its own: the knob is read once.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "config/env.h"
#include "kernels/cpu_adam.h"
#include "kernels/cpu_variant.h"

namespace tide::kernels {
namespace {

constexpr unsigned bit(CpuIsa isa) { return 1u << static_cast<unsigned>(isa); }
constexpr unsigned kScalarOnly = bit(CpuIsa::kScalar);
constexpr unsigned kAvx2Machine = kScalarOnly | bit(CpuIsa::kAvx2);
constexpr unsigned kAvx512Machine = kAvx2Machine | bit(CpuIsa::kAvx512);
constexpr unsigned kAvx512Bf16Machine = kAvx512Machine | bit(CpuIsa::kAvx512Bf16);

std::string refusal(std::string_view value, unsigned supported) {
  try {
    choose_cpu_isa(value, supported);
  } catch (const config::EnvError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(CpuIsaKnobTest, AutoIsTheWidestTheMachineRuns) {
  EXPECT_EQ(choose_cpu_isa("auto", kAvx512Bf16Machine), CpuIsa::kAvx512Bf16);
  EXPECT_EQ(choose_cpu_isa("auto", kAvx512Machine), CpuIsa::kAvx512);
  EXPECT_EQ(choose_cpu_isa("auto", kAvx2Machine), CpuIsa::kAvx2);
  EXPECT_EQ(choose_cpu_isa("auto", kScalarOnly), CpuIsa::kScalar);
}

TEST(CpuIsaKnobTest, ForcesAnyVariantTheMachineRuns) {
  EXPECT_EQ(choose_cpu_isa("avx512bf16", kAvx512Bf16Machine), CpuIsa::kAvx512Bf16);
  EXPECT_EQ(choose_cpu_isa("avx512", kAvx512Bf16Machine), CpuIsa::kAvx512);
  EXPECT_EQ(choose_cpu_isa("avx512", kAvx512Machine), CpuIsa::kAvx512);
  EXPECT_EQ(choose_cpu_isa("avx2", kAvx512Machine), CpuIsa::kAvx2);
  EXPECT_EQ(choose_cpu_isa("scalar", kAvx512Machine), CpuIsa::kScalar);
  EXPECT_EQ(choose_cpu_isa(" avx2 ", kAvx2Machine), CpuIsa::kAvx2);
}

TEST(CpuIsaKnobTest, RefusesAVariantTheMachineCannotRun) {
  const std::string on_avx2 = refusal("avx512", kAvx2Machine);
  EXPECT_NE(on_avx2.find("TIDE_CPU_ISA=\"avx512\""), std::string::npos) << on_avx2;
  EXPECT_NE(on_avx2.find("this CPU cannot run the avx512 kernels"), std::string::npos) << on_avx2;
  EXPECT_NE(on_avx2.find("one of: auto, avx2, scalar"), std::string::npos) << on_avx2;
  const std::string on_avx512 = refusal("avx512bf16", kAvx512Machine);
  EXPECT_NE(on_avx512.find("one of: auto, avx512, avx2, scalar (this CPU cannot run the "
                           "avx512bf16 kernels)"),
            std::string::npos)
      << on_avx512;
  const std::string on_scalar = refusal("avx2", kScalarOnly);
  EXPECT_NE(on_scalar.find("one of: auto, scalar (this CPU cannot run the avx2 kernels)"),
            std::string::npos)
      << on_scalar;
}

TEST(CpuIsaKnobTest, RefusesValuesItDoesNotAccept) {
  for (const char* bad : {"AVX2", "avx", "sse", "best", "1", "avx2,scalar", "avx512_bf16"}) {
    const std::string message = refusal(bad, kAvx512Machine);
    EXPECT_NE(message.find("TIDE_CPU_ISA"), std::string::npos) << bad << ": " << message;
    EXPECT_NE(message.find("one of: auto avx512bf16 avx512 avx2 scalar"), std::string::npos)
        << message;
  }
}

// Last: the process's default is read once, and only a valid value sticks.
TEST(CpuIsaKnobTest, TheEnvironmentPicksTheKernelsDefault) {
  ::setenv("TIDE_CPU_ISA", "sometimes", 1);
  EXPECT_THROW(default_cpu_isa(), config::EnvError);
  EXPECT_THROW(default_cpu_isa(), config::EnvError);  // every call, not just the first
  if (!cpu_supports(CpuIsa::kAvx512)) {
    ::setenv("TIDE_CPU_ISA", "avx512", 1);
    EXPECT_THROW(default_cpu_isa(), config::EnvError);
  }
  if (!cpu_supports(CpuIsa::kAvx512Bf16)) {
    ::setenv("TIDE_CPU_ISA", "avx512bf16", 1);
    EXPECT_THROW(default_cpu_isa(), config::EnvError);
  }
  ::setenv("TIDE_CPU_ISA", "scalar", 1);
  EXPECT_EQ(default_cpu_isa(), CpuIsa::kScalar);
  ::setenv("TIDE_CPU_ISA", "auto", 1);  // read once: the first valid value stays
  EXPECT_EQ(default_cpu_isa(), CpuIsa::kScalar);
  // A step with the default options runs (on the scalar table).
  float param[3] = {1, 2, 3}, grad[3] = {1, 1, 1}, m[3] = {}, v[3] = {};
  AdamSubgroup s;
  s.grad = grad;
  s.param = param;
  s.exp_avg = m;
  s.exp_avg_sq = v;
  s.count = 3;
  EXPECT_EQ(cpu_adam_step(s, AdamHyper{}).nonfinite, 0u);
  EXPECT_LT(param[0], 1.0f);
}

}  // namespace
}  // namespace tide::kernels
