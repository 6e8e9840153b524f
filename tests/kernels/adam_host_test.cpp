// The fused Adam kernel's own source (kernels/cuda/adam.cu compiled for the host through
// kernels/host/cuda_emulation.h) run over launch grids by the host runner, every block and thread:
// its outputs equal the CPU path's (cpu_adam_step) bit for bit and the float64 reference within
// 1e-6 relative norm (tests/kernels/adam_test_util.h), for every dtype combination; lengths 0 to
// 70 and large; every buffer at every misalignment to the kernel's 8-element vectors, alone and
// all together; 32 subgroups of mixed alignment per launch; grids smaller and larger than the
// work, and grid rows past the subgroups; non-finite gradients, moments and results. Nothing is
// written outside the buffers, and the non-finite counts are the CPU path's.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/adam_gpu.h"
#include "kernels/adam_kernel.h"
#include "kernels/cpu_adam.h"
#include "kernels/host/grid.h"
#include "kernels/host_kernel.h"
#include "tests/kernels/adam_test_util.h"

namespace tide::kernels::testing {
namespace {

using Misalignment = std::array<unsigned, 5>;  // grad, param, exp_avg, exp_avg_sq, copy

// All buffers together at each offset (a head of 8 − m elements before the vectors, or none), each
// buffer alone at each offset (never a vector: one element at a time), and a few at random.
std::vector<Misalignment> misalignments(std::mt19937_64& rng) {
  std::vector<Misalignment> out;
  for (unsigned m = 0; m < kAdamVectorElements; ++m) out.push_back({m, m, m, m, m});
  for (unsigned k = 0; k < 5; ++k) {
    for (unsigned m = 1; m < kAdamVectorElements; ++m) {
      Misalignment a{};
      a[k] = m;
      out.push_back(a);
    }
  }
  for (int i = 0; i < 4; ++i) {
    Misalignment a;
    for (unsigned& m : a) m = static_cast<unsigned>(rng() % 16);
    out.push_back(a);
  }
  return out;
}

// One subgroup: the buffers the kernel steps, the copy the CPU path steps, the inputs.
struct Case {
  std::unique_ptr<Subgroup> kernel;
  std::unique_ptr<Subgroup> cpu;
  Snapshot before;
  std::uint64_t cpu_nonfinite = 0;
};

// Non-finite gradients in the head, the vectors and the tail; a NaN second moment; a gradient
// whose square overflows (a non-finite result from finite inputs). Varies with `pick`.
void poison(Subgroup& s, std::uint64_t pick) {
  const std::size_t n = s.count;
  if (n < 3 || pick % 3 == 0) return;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  s.grad.set(pick % std::min<std::size_t>(n, 8), pick % 2 ? nan : -inf);
  s.grad.set(n / 2, pick % 5 ? inf : nan);
  s.grad.set(n - 1 - pick % std::min<std::size_t>(n, 8), 3e38f);
  if (pick % 7 == 1) s.exp_avg_sq.set(n / 3, nan);
}

class AdamHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = fresh_seed();
    rng_.seed(seed_);
  }

  Case make_case(std::size_t n, const Layout& layout, const AdamHyper& h, const Misalignment& m) {
    Case c;
    c.kernel = std::make_unique<Subgroup>(n, layout, rng_, m);
    c.kernel->fill(rng_, static_cast<float>(h.grad_scale));
    poison(*c.kernel, rng_());
    c.cpu = std::make_unique<Subgroup>(*c.kernel);
    c.before = snapshot(*c.kernel);
    CpuAdamOptions one;
    one.threads = 1;
    c.cpu_nonfinite = cpu_adam_step(c.cpu->view(), h, one).nonfinite;
    return c;
  }

  // Launches the kernel over `cases` (at most 32) with a grid of `grid_x` × (rows + extra_rows)
  // blocks of `block` threads, and checks every output.
  void launch_and_check(std::vector<Case>& cases, const Layout& layout, const AdamHyper& h,
                        unsigned grid_x, unsigned block, unsigned extra_rows, ErrorNorms& norms) {
    const auto rows = static_cast<unsigned>(cases.size());
    ASSERT_LE(rows, kMaxAdamKernelSubgroups);
    constexpr unsigned long long kUntouched = 0x5a5a5a5a5a5a5a5aull;
    std::vector<unsigned long long> counters(rows + extra_rows, kUntouched);
    std::fill_n(counters.begin(), rows, 0ull);
    AdamKernelParams p{};
    p.terms = adam_coefficients(h);
    p.nonfinite = reinterpret_cast<std::uint64_t>(counters.data());
    p.subgroup_count = rows;
    p.grad_dtype = layout.grad;
    p.state_dtype = layout.state;
    p.has_copy = layout.copy ? 1 : 0;
    p.copy_dtype = layout.copy.value_or(Dtype::kBFloat16);
    for (unsigned r = 0; r < rows; ++r) {
      Subgroup& s = *cases[r].kernel;
      auto address = [](const Buffer& b) { return reinterpret_cast<std::uint64_t>(b.data()); };
      p.subgroups[r] = {address(s.grad),
                        address(s.param),
                        address(s.exp_avg),
                        address(s.exp_avg_sq),
                        layout.copy ? address(s.copy) : 0,
                        s.count,
                        0,
                        0,
                        0};
    }
    const HostKernelEntry* adam = find_host_kernel(kAdamKernel);
    ASSERT_NE(adam, nullptr);
    const HostGrid grid{{grid_x, rows + extra_rows, 1}, {block, 1, 1}, 0};
    host::run_grid(grid, adam->thread, &p);

    for (unsigned r = 0; r < rows; ++r) {
      const Case& c = cases[r];
      const Subgroup& k = *c.kernel;
      const Subgroup& cpu = *c.cpu;
      SCOPED_TRACE("row " + std::to_string(r) + ": " + std::to_string(k.count) + " elements");
      EXPECT_EQ(counters[r], c.cpu_nonfinite);
      EXPECT_EQ(k.param.bytes(k.count), cpu.param.bytes(k.count));
      EXPECT_EQ(k.exp_avg.bytes(k.count), cpu.exp_avg.bytes(k.count));
      EXPECT_EQ(k.exp_avg_sq.bytes(k.count), cpu.exp_avg_sq.bytes(k.count));
      if (layout.copy) {
        EXPECT_EQ(k.copy.bytes(k.count), cpu.copy.bytes(k.count));
      }
      EXPECT_EQ(k.grad.bytes(k.count), cpu.grad.bytes(k.count)) << "the kernel wrote gradients";
      for (const Buffer* b : {&k.grad, &k.param, &k.exp_avg, &k.exp_avg_sq, &k.copy}) {
        EXPECT_TRUE(b->canaries_intact()) << "the kernel wrote outside a buffer";
      }
      std::vector<bool> rejected(k.count);
      const AdamCoefficients terms = adam_coefficients(h);
      for (std::size_t i = 0; i < k.count; ++i) {
        float pp = c.before.p[i], m = c.before.m[i], v = c.before.v[i];
        rejected[i] = !adam_element<HostMath>(terms, c.before.grad[i], pp, m, v);
      }
      expect_step(h, c.before, k, rejected, &norms);
    }
    for (unsigned r = rows; r < rows + extra_rows; ++r) {
      EXPECT_EQ(counters[r], kUntouched) << "grid row " << r << " has no subgroup";
    }
  }

  std::uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

// Grid shapes: one block per row (smaller than the work past 2048 elements), the launcher's own
// shape, more blocks than there is work for, and smaller blocks.
struct GridChoice {
  unsigned grid_x;  // 0: the launcher's (AdamGpu::shape)
  unsigned block;
  unsigned extra_rows;
};
const GridChoice kGrids[] = {{1, 256, 0}, {0, 256, 2}, {5, 64, 0}, {3, 32, 1}};

unsigned grid_x_for(const GridChoice& g, const std::vector<Case>& cases) {
  if (g.grid_x != 0) return g.grid_x;
  std::uint64_t max_count = 0;
  for (const Case& c : cases) max_count = std::max<std::uint64_t>(max_count, c.kernel->count);
  return AdamGpu::shape(max_count, static_cast<unsigned>(cases.size())).grid_x;
}

TEST_F(AdamHostTest, ShortSubgroupsAtEveryMisalignmentEqualTheCpuPath) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const std::vector<Misalignment> all = misalignments(rng_);
  for (const Layout& layout : all_layouts()) {
    SCOPED_TRACE(layout.name());
    const AdamHyper h = random_hyper(rng_);
    SCOPED_TRACE(describe(h));
    ErrorNorms norms;
    std::vector<Case> launch;
    unsigned launches = 0;
    for (std::size_t n = 0; n <= 70; ++n) {
      for (const Misalignment& m : all) {
        launch.push_back(make_case(n, layout, h, m));
        if (launch.size() == kMaxAdamKernelSubgroups) {
          const GridChoice& g = kGrids[launches++ % std::size(kGrids)];
          launch_and_check(launch, layout, h, grid_x_for(g, launch), g.block, g.extra_rows, norms);
          launch.clear();
        }
      }
    }
    if (!launch.empty()) launch_and_check(launch, layout, h, 1, 256, 3, norms);
    norms.expect_within(1e-6);
    if (HasFailure()) return;
  }
}

TEST_F(AdamHostTest, LargeSubgroupsOnGridsSmallerAndLargerThanTheWorkEqualTheCpuPath) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const std::size_t lengths[] = {2 * 2048 + 5, 3 * 4096 + 3, 40003};
  const Misalignment aligned{0, 0, 0, 0, 0}, head{3, 3, 3, 3, 3}, apart{0, 1, 0, 0, 0};
  for (const Layout& layout : all_layouts()) {
    SCOPED_TRACE(layout.name());
    const AdamHyper h = random_hyper(rng_);
    SCOPED_TRACE(describe(h));
    ErrorNorms norms;
    std::vector<Case> launch;
    for (std::size_t n : lengths) {
      for (const Misalignment& m : {aligned, head, apart})
        launch.push_back(make_case(n, layout, h, m));
    }
    const unsigned exact = grid_x_for({0, 256, 0}, launch);
    for (const GridChoice& g :
         {GridChoice{1, 256, 0}, GridChoice{exact, 256, 1}, GridChoice{2 * exact + 3, 256, 0}}) {
      SCOPED_TRACE("grid " + std::to_string(g.grid_x) + " x " + std::to_string(g.block));
      std::vector<Case> again;
      for (const Case& c : launch) {
        // The same inputs for every grid: a fresh copy of the originals.
        Case copy;
        copy.kernel = std::make_unique<Subgroup>(*c.kernel);
        copy.cpu = std::make_unique<Subgroup>(*c.cpu);
        copy.before = c.before;
        copy.cpu_nonfinite = c.cpu_nonfinite;
        again.push_back(std::move(copy));
      }
      launch_and_check(again, layout, h, g.grid_x, g.block, g.extra_rows, norms);
    }
    norms.expect_within(1e-6);
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace tide::kernels::testing
