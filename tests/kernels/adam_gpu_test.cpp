// The fused CUDA Adam kernel through its launcher, against the CPU path, bit for bit: every
// dtype combination, many subgroups per launch (more than one launch holds), lengths around the
// vector width, aligned and unaligned buffers, non-finite gradients.
//
// Built twice: kernels_adam_gpu_standin_test runs it against the host stand-in driver (the
// launch runs the kernel's own source, compiled for the host); kernels_adam_gpu_test (label `gpu`,
// TIDE_REAL_GPU) against the real driver, and exits 77 (skipped) when no GPU driver loads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "driver/context.h"
#include "driver/cuda_api.h"
#include "driver/memory.h"
#include "driver/stream.h"
#include "kernels/adam_gpu.h"
#include "kernels/cpu_adam.h"
#include "tests/gpu_test_support.h"
#include "tests/kernels/adam_test_util.h"

namespace tide::kernels::testing {
namespace {

// The buffers of many subgroups in one device allocation (one upload, one download: copies
// are what costs time on the stand-in), each buffer `misalign` elements past a 256-byte line.
class DeviceArena {
 public:
  // Places the five buffers of `s` (grad, param, exp_avg, exp_avg_sq, copy) and stages their
  // contents; returns the subgroup's index.
  std::size_t add(const Subgroup& s, unsigned misalign) {
    const Buffer* buffers[5] = {&s.grad, &s.param, &s.exp_avg, &s.exp_avg_sq, &s.copy};
    // The weights' misalignment differs from the others' for some values of `misalign`, so
    // that the kernel meets buffers that never reach a vector boundary together.
    const unsigned shift[5] = {misalign, misalign % 5, misalign, misalign, misalign};
    Placement placement;
    for (int k = 0; k < 5; ++k) {
      const std::size_t size = dtype_size(buffers[k]->dtype());
      const std::size_t offset = (staging_.size() + 255) / 256 * 256 + shift[k] * size;
      staging_.resize(offset + s.count * size + 1);
      std::memcpy(staging_.data() + offset, buffers[k]->data(), s.count * size);
      placement.offset[k] = offset;
      placement.bytes[k] = s.count * size;
    }
    placement.count = s.count;
    placements_.push_back(placement);
    return placements_.size() - 1;
  }

  void upload() {
    device_ = driver::DeviceBuffer(staging_.size());
    driver::copy_to_device(device_.get(), staging_.data(), staging_.size());
  }
  void download() { driver::copy_to_host(staging_.data(), device_.get(), staging_.size()); }

  AdamGpuSubgroup view(std::size_t i) const {
    const Placement& p = placements_[i];
    const CUdeviceptr base = device_.get();
    return {base + p.offset[0], base + p.offset[1], base + p.offset[2],
            base + p.offset[3], base + p.offset[4], p.count};
  }
  // Buffer k (0 grad, 1 param, 2 exp_avg, 3 exp_avg_sq, 4 copy) of subgroup i, as downloaded.
  std::vector<unsigned char> bytes(std::size_t i, int k) const {
    const Placement& p = placements_[i];
    const unsigned char* first = staging_.data() + p.offset[k];
    return {first, first + p.bytes[k]};
  }

 private:
  struct Placement {
    std::size_t offset[5];
    std::size_t bytes[5];
    std::size_t count;
  };
  std::vector<unsigned char> staging_;
  std::vector<Placement> placements_;
  driver::DeviceBuffer device_;
};

class AdamGpuTest : public ::testing::Test {
 protected:
  driver::CurrentContext context_{0};
};

// Lengths around the kernel's 8-element vectors and the CPU's 16, one large enough for many
// blocks and grid-stride steps, and an empty subgroup.
const std::size_t kLengths[] = {0, 1, 7, 8, 9, 17, 100, 1023, 4096, 30001};

TEST_F(AdamGpuTest, MatchesTheCpuPathBitForBitForEveryDtype) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const AdamGpu adam;
  driver::Stream stream;
  for (const Layout& layout : all_layouts()) {
    SCOPED_TRACE(layout.name());
    const AdamHyper h = random_hyper(rng);
    SCOPED_TRACE(describe(h));
    std::vector<std::unique_ptr<Subgroup>> cpu;  // stepped by the CPU path
    std::vector<std::uint64_t> expected;
    DeviceArena arena;
    for (std::size_t n : kLengths) {
      // Misalignments: 0 (the vector path), 3 (a head, the buffers together), 6 and 11 (the
      // weights apart from the others: one element at a time).
      for (unsigned misalign : {0u, 3u, 6u, 11u}) {
        cpu.push_back(std::make_unique<Subgroup>(n, layout, rng, misalign));
        Subgroup& s = *cpu.back();
        s.fill(rng, static_cast<float>(h.grad_scale));
        if (n > 50) {  // some non-finite gradients
          s.grad.set(n / 2, std::numeric_limits<float>::quiet_NaN());
          s.grad.set(n - 1, std::numeric_limits<float>::infinity());
        }
        arena.add(s, misalign);
        CpuAdamOptions one;
        one.threads = 1;
        expected.push_back(cpu_adam_step(s.view(), h, one).nonfinite);
      }
    }
    const std::size_t count = cpu.size();
    ASSERT_GT(count, kMaxAdamKernelSubgroups);  // two launches
    arena.upload();
    std::vector<AdamGpuSubgroup> views;
    for (std::size_t i = 0; i < count; ++i) views.push_back(arena.view(i));
    driver::DeviceBuffer counts(count * sizeof(std::uint64_t));
    const AdamGpuDtypes dtypes{layout.grad, layout.state, layout.copy};
    adam.step(views, dtypes, h, counts.get(), stream);
    stream.synchronize();
    arena.download();
    std::vector<std::uint64_t> got(count);
    driver::copy_to_host(got.data(), counts.get(), count * sizeof(std::uint64_t));
    for (std::size_t i = 0; i < count; ++i) {
      const Subgroup& s = *cpu[i];
      SCOPED_TRACE("subgroup " + std::to_string(i) + " of " + std::to_string(s.count));
      EXPECT_EQ(got[i], expected[i]);
      EXPECT_EQ(arena.bytes(i, 1), s.param.bytes(s.count));
      EXPECT_EQ(arena.bytes(i, 2), s.exp_avg.bytes(s.count));
      EXPECT_EQ(arena.bytes(i, 3), s.exp_avg_sq.bytes(s.count));
      if (layout.copy) {
        EXPECT_EQ(arena.bytes(i, 4), s.copy.bytes(s.count));
      }
    }
    if (HasFailure()) return;
  }
}

TEST_F(AdamGpuTest, RejectsBadArguments) {
  const AdamGpu adam;
  driver::Stream stream;
  driver::DeviceBuffer buffer(1 << 16);
  driver::DeviceBuffer counts(64);
  const CUdeviceptr b = buffer.get();
  AdamGpuSubgroup s{b, b + 4096, b + 8192, b + 12288, b + 16384, 16};
  AdamGpuDtypes dtypes;
  dtypes.state = Dtype::kFloat16;
  EXPECT_THROW(adam.step({&s, 1}, dtypes, AdamHyper{}, counts.get(), stream),
               std::invalid_argument);
  dtypes = AdamGpuDtypes{};
  AdamGpuSubgroup unaligned = s;
  unaligned.param += 2;
  EXPECT_THROW(adam.step({&unaligned, 1}, dtypes, AdamHyper{}, counts.get(), stream),
               std::invalid_argument);
  AdamHyper bad;
  bad.step = 0;
  EXPECT_THROW(adam.step({&s, 1}, dtypes, bad, counts.get(), stream), std::invalid_argument);
  EXPECT_THROW(adam.step({&s, 1}, dtypes, AdamHyper{}, 0, stream), std::invalid_argument);
  stream.synchronize();
}

// 8-bit moments (kernels/quant8.h) through the launcher: the CPU path's bytes, bit for bit, for
// lengths within, at and across quantization blocks, several subgroups in one launch.
TEST_F(AdamGpuTest, EightBitMomentsMatchTheCpuPathBitForBit) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const AdamGpu adam;
  driver::Stream stream;
  const AdamHyper h = random_hyper(rng);
  SCOPED_TRACE(describe(h));
  const std::size_t lengths[] = {0, 1, 255, 256, 257, 3000, 30001};
  // Per subgroup: grad (bf16), param, copy (bf16), two code buffers and two scale buffers, each
  // at a 256-byte boundary of one device allocation (the weights 4 bytes past one, so the kernel
  // also meets buffers off its vector boundary).
  struct Layout8 {
    std::size_t n, offset[7], bytes[7];
  };
  std::vector<Layout8> layouts;
  std::vector<unsigned char> host;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t n : lengths) {
    Layout8 l{n, {}, {}};
    const std::size_t sizes[7] = {2, 4, 2, 1, 1, 0, 0};
    for (int k = 0; k < 7; ++k) {
      l.bytes[k] = k < 5 ? n * sizes[k] : quant_blocks(n) * 4;
      l.offset[k] = (host.size() + 255) / 256 * 256 + (k == 1 && n % 2 == 1 ? 4 : 0);
      host.resize(l.offset[k] + l.bytes[k] + 1);
    }
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t g = float_to_bf16(normal(rng));
      const float p = normal(rng);
      std::memcpy(&host[l.offset[0] + 2 * i], &g, 2);
      std::memcpy(&host[l.offset[1] + 4 * i], &p, 4);
      host[l.offset[3] + i] = static_cast<unsigned char>(rng());
      host[l.offset[4] + i] = static_cast<unsigned char>(rng());
    }
    for (std::size_t b = 0; b < quant_blocks(n); ++b) {
      const float sm = 0.1f * (1.0f + std::abs(normal(rng))),
                  sv = 1e-3f * static_cast<float>(1 + b % 3);
      std::memcpy(&host[l.offset[5] + 4 * b], &sm, 4);
      std::memcpy(&host[l.offset[6] + 4 * b], &sv, 4);
    }
    layouts.push_back(l);
  }
  // The CPU path on a host copy (its code buffers at the same 256-byte boundaries: the host
  // copy is itself 256-byte aligned).
  auto cpu_storage = std::make_unique<unsigned char[]>(host.size() + 256);
  unsigned char* cpu =
      cpu_storage.get() + (256 - reinterpret_cast<std::uintptr_t>(cpu_storage.get()) % 256) % 256;
  std::memcpy(cpu, host.data(), host.size());
  std::vector<std::uint64_t> expected;
  for (const Layout8& l : layouts) {
    AdamSubgroup s;
    s.grad = cpu + l.offset[0];
    s.param = reinterpret_cast<float*>(cpu + l.offset[1]);
    s.param_copy = cpu + l.offset[2];
    s.exp_avg = cpu + l.offset[3];
    s.exp_avg_sq = cpu + l.offset[4];
    s.exp_avg_scale = reinterpret_cast<float*>(cpu + l.offset[5]);
    s.exp_avg_sq_scale = reinterpret_cast<float*>(cpu + l.offset[6]);
    s.count = l.n;
    s.grad_dtype = Dtype::kBFloat16;
    s.copy_dtype = Dtype::kBFloat16;
    s.state_format = StateFormat::kBlockQ8;
    expected.push_back(cpu_adam_step(s, h).nonfinite);
  }
  driver::DeviceBuffer device(host.size());
  driver::copy_to_device(device.get(), host.data(), host.size());
  std::vector<AdamGpuSubgroup> views;
  for (const Layout8& l : layouts) {
    const CUdeviceptr b = device.get();
    views.push_back({b + l.offset[0], b + l.offset[1], b + l.offset[3], b + l.offset[4],
                     b + l.offset[2], l.n, b + l.offset[5], b + l.offset[6]});
  }
  driver::DeviceBuffer counts(views.size() * sizeof(std::uint64_t));
  AdamGpuDtypes dtypes{Dtype::kBFloat16, Dtype::kFloat32, Dtype::kBFloat16};
  dtypes.state_format = StateFormat::kBlockQ8;
  adam.step(views, dtypes, h, counts.get(), stream);
  stream.synchronize();
  driver::copy_to_host(host.data(), device.get(), host.size());
  std::vector<std::uint64_t> got(views.size());
  driver::copy_to_host(got.data(), counts.get(), got.size() * sizeof(std::uint64_t));
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    const Layout8& l = layouts[i];
    SCOPED_TRACE("subgroup of " + std::to_string(l.n));
    EXPECT_EQ(got[i], expected[i]);
    for (int k = 1; k < 7; ++k) {
      EXPECT_EQ(0, std::memcmp(host.data() + l.offset[k], cpu + l.offset[k], l.bytes[k]))
          << "buffer " << k << " (1 param, 2 copy, 3-4 codes, 5-6 scales)";
    }
  }
}

// bf16 master weights with compensation (AdamGpuDtypes::master): grad bf16, weight and
// compensation bf16, moments fp32, several subgroups in one launch, some gradients non-finite.
TEST_F(AdamGpuTest, Bf16MasterWeightsMatchTheCpuPathBitForBit) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const AdamGpu adam;
  driver::Stream stream;
  const AdamHyper h = random_hyper(rng);
  SCOPED_TRACE(describe(h));
  constexpr int kBuffers = 5;  // grad, weight, compensation, exp_avg, exp_avg_sq
  const std::size_t sizes[kBuffers] = {2, 2, 2, 4, 4};
  struct Place {
    std::size_t n, offset[kBuffers];
  };
  std::vector<Place> places;
  std::vector<unsigned char> host;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t n : {0, 1, 7, 9, 100, 4097}) {
    Place pl{n, {}};
    for (int k = 0; k < kBuffers; ++k) {
      pl.offset[k] = (host.size() + 255) / 256 * 256 + (n % 2 == 1 ? sizes[k] : 0);
      host.resize(pl.offset[k] + n * sizes[k] + 1);
    }
    for (std::size_t i = 0; i < n; ++i) {
      const float p = normal(rng), m = 0.1f * normal(rng), v = 1e-3f * std::abs(normal(rng));
      const std::uint16_t w = float_to_bf16(p), c = float_to_bf16(p - bf16_to_float(w));
      const std::uint16_t g = float_to_bf16(i == n / 2 && n > 8 ? NAN : normal(rng));
      std::memcpy(&host[pl.offset[0] + 2 * i], &g, 2);
      std::memcpy(&host[pl.offset[1] + 2 * i], &w, 2);
      std::memcpy(&host[pl.offset[2] + 2 * i], &c, 2);
      std::memcpy(&host[pl.offset[3] + 4 * i], &m, 4);
      std::memcpy(&host[pl.offset[4] + 4 * i], &v, 4);
    }
    places.push_back(pl);
  }
  std::vector<unsigned char> cpu = host;
  std::vector<std::uint64_t> expected;
  for (const Place& pl : places) {
    AdamSubgroup s;
    s.grad = &cpu[pl.offset[0]];
    s.param_bf16 = reinterpret_cast<std::uint16_t*>(&cpu[pl.offset[1]]);
    s.param_comp = reinterpret_cast<std::uint16_t*>(&cpu[pl.offset[2]]);
    s.exp_avg = &cpu[pl.offset[3]];
    s.exp_avg_sq = &cpu[pl.offset[4]];
    s.count = pl.n;
    s.grad_dtype = Dtype::kBFloat16;
    s.master_dtype = Dtype::kBFloat16;
    expected.push_back(cpu_adam_step(s, h).nonfinite);
  }
  driver::DeviceBuffer device(host.size());
  driver::copy_to_device(device.get(), host.data(), host.size());
  std::vector<AdamGpuSubgroup> views;
  for (const Place& pl : places) {
    AdamGpuSubgroup v;
    const CUdeviceptr b = device.get();
    v.grad = b + pl.offset[0];
    v.param_bf16 = b + pl.offset[1];
    v.param_comp = b + pl.offset[2];
    v.exp_avg = b + pl.offset[3];
    v.exp_avg_sq = b + pl.offset[4];
    v.count = pl.n;
    views.push_back(v);
  }
  driver::DeviceBuffer counts(views.size() * sizeof(std::uint64_t));
  AdamGpuDtypes dtypes{Dtype::kBFloat16, Dtype::kFloat32, std::nullopt};
  dtypes.master = Dtype::kBFloat16;
  adam.step(views, dtypes, h, counts.get(), stream);
  stream.synchronize();
  driver::copy_to_host(host.data(), device.get(), host.size());
  std::vector<std::uint64_t> got(views.size());
  driver::copy_to_host(got.data(), counts.get(), got.size() * sizeof(std::uint64_t));
  EXPECT_EQ(got, expected);
  EXPECT_EQ(host, cpu);
  EXPECT_GE(expected.back(), 1u);

  // No weight copy, no 8-bit moments and no fp32 `param` with bf16 master weights.
  views.back().param = views.back().param_bf16;
  EXPECT_THROW(adam.step(views, dtypes, h, counts.get(), stream), std::invalid_argument);
  views.back().param = 0;
  dtypes.copy = Dtype::kBFloat16;
  EXPECT_THROW(adam.step(views, dtypes, h, counts.get(), stream), std::invalid_argument);
  dtypes.copy = std::nullopt;
  dtypes.state_format = StateFormat::kBlockQ8;
  EXPECT_THROW(adam.step(views, dtypes, h, counts.get(), stream), std::invalid_argument);
}

TEST_F(AdamGpuTest, RefusesEightBitSubgroupsThatDoNotStartOnABlock) {
  const AdamGpu adam;
  driver::Stream stream;
  driver::DeviceBuffer buffer(1 << 16);
  driver::DeviceBuffer counts(64);
  const CUdeviceptr b = (buffer.get() + 255) / 256 * 256;
  AdamGpuDtypes dtypes;
  dtypes.state_format = StateFormat::kBlockQ8;
  AdamGpuSubgroup s{b, b + 4096, b + 8192, b + 12288, b + 16384, 300, b + 20480, b + 24576};
  EXPECT_NO_THROW(adam.step({&s, 1}, dtypes, AdamHyper{}, counts.get(), stream));
  AdamGpuSubgroup off = s;
  off.exp_avg += 100;  // 100 elements into a block
  try {
    adam.step({&off, 1}, dtypes, AdamHyper{}, counts.get(), stream);
    ADD_FAILURE() << "a subgroup off a quantization block was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("exp_avg codes of subgroup 0 are null or do not start "
                                         "at a 256-byte boundary"),
              std::string::npos)
        << e.what();
  }
  off = s;
  off.exp_avg_sq_scale = 0;
  EXPECT_THROW(adam.step({&off, 1}, dtypes, AdamHyper{}, counts.get(), stream),
               std::invalid_argument);
  stream.synchronize();
}

// The vector path's head: the elements before every buffer is at a common 8-element boundary,
// or ~0 where the buffers never are (fp32 master weights and moments, bf16 gradient and copy).
TEST(AdamVectorHeadTest, CommonBoundaryOrNone) {
  constexpr std::uint64_t kBase = 1 << 20;  // every buffer 16-byte aligned at element 0
  AdamKernelSubgroup s{};
  s.param = kBase;
  s.exp_avg = 2 * kBase;
  s.exp_avg_sq = 3 * kBase;
  s.grad = 4 * kBase;
  s.param_copy = 5 * kBase;
  EXPECT_EQ(adam_vector_head(s, 2, 4, 2), 0u);
  // Every buffer three elements on: five to the next boundary.
  AdamKernelSubgroup on = s;
  on.param += 3 * 4;
  on.exp_avg += 3 * 4;
  on.exp_avg_sq += 3 * 4;
  on.grad += 3 * 2;
  on.param_copy += 3 * 2;
  EXPECT_EQ(adam_vector_head(on, 2, 4, 2), 5u);
  // The copy one element off the others: never together, unless there is no copy.
  AdamKernelSubgroup off = on;
  off.param_copy += 2;
  EXPECT_EQ(adam_vector_head(off, 2, 4, 2), ~std::uint64_t{0});
  EXPECT_EQ(adam_vector_head(off, 2, 4, 0), 5u);
  // bf16 moments: their own element size.
  AdamKernelSubgroup bf16 = on;
  bf16.exp_avg = 2 * kBase + 3 * 2;
  bf16.exp_avg_sq = 3 * kBase + 3 * 2;
  EXPECT_EQ(adam_vector_head(bf16, 2, 2, 2), 5u);
  EXPECT_EQ(adam_vector_head(bf16, 2, 4, 2), ~std::uint64_t{0});
}

TEST(AdamGpuShapeTest, CoversSmallAndLargeSubgroups) {
  EXPECT_EQ(AdamGpu::shape(0, 1).grid_x, 1u);
  EXPECT_EQ(AdamGpu::shape(1, 1).grid_x, 1u);
  EXPECT_EQ(AdamGpu::shape(2048, 3).grid_x, 1u);
  EXPECT_EQ(AdamGpu::shape(2049, 3).grid_y, 3u);
  EXPECT_EQ(AdamGpu::shape(2049, 3).grid_x, 2u);
  EXPECT_EQ(AdamGpu::shape(std::uint64_t{1} << 40, 1).grid_x, 4096u);
  EXPECT_EQ(AdamGpu::shape(std::uint64_t{1} << 40, 32).grid_x, 128u);
  EXPECT_EQ(AdamGpu::shape(100, 1).block_x, kAdamBlockThreads);
}

}  // namespace
}  // namespace tide::kernels::testing
