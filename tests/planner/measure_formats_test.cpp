// The CPU update factors tide calibrate writes (planner/measure.h): each format's rate over fp32
// state's, alone and while copies run, from the slowest rank's measurements.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "driver/context.h"
#include "planner/host_memory.h"
#include "planner/measure.h"

namespace tide::planner {
namespace {

CpuFormatRates rates(double fp32, double bf16, double q8, double master, double master_bf16) {
  CpuFormatRates r;
  r.fp32 = fp32;
  r.format = {bf16, q8, master, master_bf16};
  return r;
}

std::size_t at(UpdateFormat f) { return static_cast<std::size_t>(f); }

TEST(MeasureFormats, FactorsAreTheSlowestRanksRatesOverItsFp32Rate) {
  const std::vector<CpuFormatRates> ranks = {rates(1e9, 1.2e9, 0.4e9, 0.7e9, 0.8e9),
                                             rates(0.8e9, 1.3e9, 0.3e9, 0.9e9, 0.6e9)};
  const CpuUpdateFactors f = cpu_update_factors(ranks);
  EXPECT_DOUBLE_EQ(f[UpdateFormat::bf16_moments], 1.2e9 / 0.8e9);
  EXPECT_DOUBLE_EQ(f[UpdateFormat::q8_moments], 0.3e9 / 0.8e9);
  EXPECT_FALSE(f.any_contended());  // no contended measurement: none (the free ones apply)
  EXPECT_DOUBLE_EQ(f.contended_or_free(UpdateFormat::q8_moments), 0.3e9 / 0.8e9);
}

// While copies run, a memory-bound fp32 update loses more than a compute-bound format: the
// contended factors are their own ratios; a rate above the same rate alone (a quiet moment on a
// busy machine) counts as the rate alone.
TEST(MeasureFormats, ContendedFactorsAreTheRatiosWhileCopying) {
  const std::vector<CpuFormatRates> alone = {rates(1e9, 1.2e9, 0.4e9, 0.7e9, 0.8e9)};
  const CpuUpdateFactors f = cpu_update_factors(alone, rates(0.5e9, 0.6e9, 0.35e9, 0.9e9, 0.4e9));
  EXPECT_DOUBLE_EQ(f[UpdateFormat::q8_moments], 0.4);
  EXPECT_DOUBLE_EQ(f.contended[at(UpdateFormat::q8_moments)], 0.7);
  EXPECT_DOUBLE_EQ(f.contended[at(UpdateFormat::bf16_moments)], 1.2);
  EXPECT_DOUBLE_EQ(f.contended[at(UpdateFormat::bf16_master)], 0.7e9 / 0.5e9);  // capped
  EXPECT_DOUBLE_EQ(f.contended[at(UpdateFormat::bf16_master_bf16_moments)], 0.8);
  // fp32 faster while copying than alone: taken as alone.
  const CpuUpdateFactors g = cpu_update_factors(alone, rates(2e9, 0.6e9, 0.35e9, 0.5e9, 0.4e9));
  EXPECT_DOUBLE_EQ(g.contended[at(UpdateFormat::q8_moments)], 0.35);
  // Out of the plausible range: measure again.
  EXPECT_THROW(cpu_update_factors(alone, rates(1e9, 1e5, 0.35e9, 0.5e9, 0.4e9)),
               std::runtime_error);
}

// Through the stand-in: every format measured while the copies run, at a rate > 0.
TEST(MeasureFormats, MeasuresEachFormatWhileCopying) {
  const driver::CurrentContext context;
  const CpuFormatRates r = measure_cpu_formats_while_copying(1 << 16, 1);
  EXPECT_GT(r.fp32, 0);
  for (double x : r.format) EXPECT_GT(x, 0);
  EXPECT_THROW(measure_cpu_formats_while_copying(100, 1), std::invalid_argument);
}

// Host memory bandwidth (tide calibrate): the Adam-like pass alone, then with copies in both
// directions counted with it; never higher than alone. Loose bounds: any machine, loaded or not.
TEST(MeasureHostMemory, AloneAndWhileCopying) {
  const double alone = measure_host_memory(std::uint64_t{8} << 20, 2);
  EXPECT_GT(alone, 1e8);
  EXPECT_LT(alone, 1e13);
  EXPECT_THROW(measure_host_memory(1000, 1), std::invalid_argument);
  EXPECT_THROW(measure_host_memory(std::uint64_t{8} << 20, 0), std::invalid_argument);

  const driver::CurrentContext context;
  MeasureOptions options;
  options.params = 65536;
  options.repeats = 2;
  options.host_memory_bytes = std::uint64_t{8} << 20;
  std::vector<RateKind> reported;
  options.progress = [&](RateKind kind, double) { reported.push_back(kind); };
  const Rates r = measure_rates(options);
  EXPECT_GT(r.host_memory, 1e8);
  EXPECT_GT(r.host_memory_contended, 0);
  EXPECT_LE(r.host_memory_contended, r.host_memory);
  EXPECT_NE(std::find(reported.begin(), reported.end(), RateKind::host_memory_contended),
            reported.end());
}

}  // namespace
}  // namespace tide::planner
