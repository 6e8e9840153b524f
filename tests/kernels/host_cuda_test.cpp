// CUDA on the host (kernels/host/cuda_emulation.h) and the grid runner (kernels/host/grid.h), with
// test kernels written as CUDA: every block and thread runs once with its built-in variables; warp
// collectives see every thread their mask names, also when threads diverge before them; what
// would hang, fault or be undefined on the device fails the launch instead; the fp16 intrinsics
// equal NVIDIA's own host implementation for every 16-bit pattern.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/host/grid.h"
#include "kernels/host_kernel.h"
#include "tests/kernels/nvidia_reference.h"
// Last: CUDA's keywords become macros.
#include "kernels/host/cuda_emulation.h"
#include "kernels/host/include/cuda_fp16.h"

namespace tide::kernels::testing {
namespace {

using host::KernelFault;
using host::run_grid;

HostGrid shape(dim3 grid, dim3 block) {
  return HostGrid{{grid.x, grid.y, grid.z}, {block.x, block.y, block.z}, 0};
}

template <auto Kernel, typename P>
void launch(dim3 grid, dim3 block, const P& params) {
  run_grid(shape(grid, block), &host::kernel_thread<Kernel>, &params);
}

// Expects the launch to fail with a message containing `what`.
template <auto Kernel, typename P>
void expect_fault(dim3 grid, dim3 block, const P& params, const std::string& what) {
  try {
    launch<Kernel>(grid, block, params);
    ADD_FAILURE() << "the launch ran; expected a fault: " << what;
  } catch (const KernelFault& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

struct Pointer {
  std::uint64_t out;
};

// --- Built-in variables -----------------------------------------------------------------------

__device__ unsigned linear_block() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}
__device__ unsigned linear_thread() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

// Ten words per thread: how often it ran, then its block and thread indices, then the dims.
__global__ void record_builtins(Pointer p) {
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  unsigned* o =
      reinterpret_cast<unsigned*>(p.out) + (linear_block() * threads + linear_thread()) * 10;
  atomicAdd(&o[0], 1u);
  const unsigned values[9] = {blockIdx.x,
                              blockIdx.y,
                              blockIdx.z,
                              threadIdx.x,
                              threadIdx.y,
                              threadIdx.z,
                              gridDim.x * 1000 + gridDim.y,
                              gridDim.z,
                              blockDim.x * 1000 + blockDim.y * 10 + blockDim.z};
  for (int k = 0; k < 9; ++k) o[1 + k] = values[k];
}

TEST(HostCudaTest, EveryThreadOfEveryBlockRunsOnceWithItsIndices) {
  const dim3 grid(3, 2, 2), block(8, 5, 2);  // 80 threads: two full warps and a partial one
  const unsigned blocks = 12, threads = 80;
  std::vector<unsigned> out(std::size_t{blocks} * threads * 10, 0);
  launch<&record_builtins>(grid, block, Pointer{reinterpret_cast<std::uint64_t>(out.data())});
  for (unsigned bz = 0; bz < 2; ++bz) {
    for (unsigned by = 0; by < 2; ++by) {
      for (unsigned bx = 0; bx < 3; ++bx) {
        for (unsigned t = 0; t < threads; ++t) {
          const unsigned b = bx + 3 * (by + 2 * bz);
          const unsigned* o = &out[(b * threads + t) * 10];
          const unsigned expected[10] = {1, bx, by, bz, t % 8, t / 8 % 5, t / 40, 3002, 2, 8052};
          ASSERT_TRUE(std::equal(o, o + 10, expected)) << "block " << b << " thread " << t;
        }
      }
    }
  }
}

// --- Warp collectives ---------------------------------------------------------------------------

struct ReduceParams {
  std::uint64_t out;
  unsigned mode;
};

// Each thread does a different amount of work first (so the warp's threads reach the collective
// at different points of their own code), then reduces; mode 1 splits the warp in two halves,
// mode 2 reduces twice in a row.
__global__ void reduce_kernel(ReduceParams p) {
  const unsigned lane = threadIdx.x % 32;
  unsigned* out = reinterpret_cast<unsigned*>(p.out) + (blockIdx.x * blockDim.x + threadIdx.x) * 2;
  unsigned value = 0;
  for (unsigned i = 0; i <= threadIdx.x % 7; ++i) value += (threadIdx.x + 1) * (blockIdx.x + 1);
  value /= (threadIdx.x % 7 + 1);  // (thread + 1) · (block + 1), the long way
  if (p.mode == 1) {
    out[0] = __reduce_add_sync(lane < 16 ? 0x0000ffffu : 0xffff0000u, value);
    return;
  }
  out[0] = __reduce_add_sync(0xffffffffu, value);
  if (p.mode == 2)
    out[1] = static_cast<unsigned>(__reduce_add_sync(0xffffffffu, -static_cast<int>(lane)));
}

TEST(HostCudaTest, AWarpCollectiveSeesEveryThreadOfItsMask) {
  for (unsigned mode : {0u, 1u, 2u}) {
    SCOPED_TRACE("mode " + std::to_string(mode));
    const unsigned blocks = 3, threads = 96;
    std::vector<unsigned> out(blocks * threads * 2, 7);
    launch<&reduce_kernel>(dim3(blocks), dim3(threads),
                           ReduceParams{reinterpret_cast<std::uint64_t>(out.data()), mode});
    for (unsigned b = 0; b < blocks; ++b) {
      for (unsigned t = 0; t < threads; ++t) {
        const unsigned first = mode == 1 ? t / 16 * 16 : t / 32 * 32;
        const unsigned width = mode == 1 ? 16 : 32;
        unsigned sum = 0;
        for (unsigned u = first; u < first + width; ++u) sum += (u + 1) * (b + 1);
        ASSERT_EQ(out[(b * threads + t) * 2], sum) << "block " << b << " thread " << t;
        // -(0 + 1 + ... + 31), wrapped as the device's int addition.
        ASSERT_EQ(out[(b * threads + t) * 2 + 1], mode == 2 ? static_cast<unsigned>(-496) : 7u);
      }
    }
  }
}

// __reduce_max_sync over values that peak at a different lane in each warp, after the threads did
// different amounts of work.
__global__ void reduce_max_kernel(ReduceParams p) {
  unsigned* out = reinterpret_cast<unsigned*>(p.out) + blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned value = 0;
  for (unsigned i = 0; i <= lane % 5; ++i) value = (lane * 7 + warp * 11 + blockIdx.x) % 32 + i;
  *out = __reduce_max_sync(0xffffffffu, value * 1000u + 0x80000000u * (lane == warp + 3));
}

TEST(HostCudaTest, AMaxCollectiveGivesEveryThreadTheWarpsMaximum) {
  const unsigned blocks = 2, threads = 96;
  std::vector<unsigned> out(blocks * threads, 7);
  launch<&reduce_max_kernel>(dim3(blocks), dim3(threads),
                             ReduceParams{reinterpret_cast<std::uint64_t>(out.data()), 0});
  for (unsigned b = 0; b < blocks; ++b) {
    for (unsigned t = 0; t < threads; ++t) {
      const unsigned warp = t / 32;
      unsigned want = 0;
      for (unsigned lane = 0; lane < 32; ++lane) {
        const unsigned value = (lane * 7 + warp * 11 + b) % 32 + lane % 5;
        want = std::max(want, value * 1000u + 0x80000000u * (lane == warp + 3));
      }
      ASSERT_EQ(out[b * threads + t], want) << "block " << b << " thread " << t;
    }
  }
}

struct FaultParams {
  std::uint64_t buffer;
  unsigned mode;
};

// The misaligned accesses are deliberate: UBSan (the ASan+UBSan build) would stop at them before
// the host header's own check.
__global__ __attribute__((no_sanitize("alignment"))) void faulty_kernel(FaultParams p) {
  const unsigned lane = threadIdx.x % 32;
  switch (p.mode) {
    case 0:  // lane 5 leaves without the collective the others wait in
      if (lane == 5) return;
      __reduce_add_sync(0xffffffffu, 1u);
      return;
    case 1:  // the halves disagree on the mask
      __reduce_add_sync(lane < 16 ? 0xffffffffu : 0xffff0000u, 1u);
      return;
    case 2:  // lane 3 names itself out
      __reduce_add_sync(lane == 3 ? 0xfffffff7u : 0xffffffffu, 1u);
      return;
    case 3:  // the full mask in a warp of fewer than 32 threads
      __reduce_add_sync(0xffffffffu, 1u);
      return;
    case 4: {  // a 16-byte load from an address 4 bytes past a multiple of 16
      const float4 v = *reinterpret_cast<const float4*>(p.buffer + 4);
      if (v.x == 12345.0f) __reduce_add_sync(0xffffffffu, 1u);
      return;
    }
    case 5:  // a 16-byte store 8 bytes past
      *reinterpret_cast<uint4*>(p.buffer + 8) = make_uint4(1, 2, 3, 4);
      return;
    case 6:  // an 8-byte atomic 4 bytes past
      atomicAdd(reinterpret_cast<unsigned long long*>(p.buffer + 4), 1ull);
      return;
    case 7:  // half the warp in a sum, half in a maximum, over one mask
      if (lane < 16) {
        __reduce_add_sync(0xffffffffu, 1u);
      } else {
        __reduce_max_sync(0xffffffffu, 1u);
      }
      return;
    case 8: {  // an 8-byte load from an address 4 bytes past a multiple of 8
      const uint2 v = *reinterpret_cast<const uint2*>(p.buffer + 4);
      if (v.x == 12345u) __reduce_add_sync(0xffffffffu, 1u);
      return;
    }
    case 9:  // an 8-byte store 2 bytes past
      *reinterpret_cast<uint2*>(p.buffer + 2) = make_uint2(1, 2);
      return;
    default:
      return;
  }
}

TEST(HostCudaTest, WhatWouldHangOrFaultOnTheDeviceFailsTheLaunch) {
  alignas(16) unsigned char buffer[64] = {};
  const auto b = reinterpret_cast<std::uint64_t>(buffer);
  expect_fault<&faulty_kernel>(dim3(2), dim3(64), FaultParams{b, 0},
                               "block (0, 0, 0) thread (0, 0, 0): __reduce_add_sync(0xffffffff) "
                               "names thread (5, 0, 0), which exited without reaching it");
  expect_fault<&faulty_kernel>(dim3(1), dim3(32), FaultParams{b, 1},
                               "which waits in __reduce_add_sync(0xffff0000)");
  expect_fault<&faulty_kernel>(dim3(1), dim3(32), FaultParams{b, 2},
                               "thread (3, 0, 0): __reduce_add_sync(0xfffffff7) from lane 3, "
                               "which the mask leaves out");
  expect_fault<&faulty_kernel>(dim3(1), dim3(40), FaultParams{b, 3},
                               "thread (32, 0, 0): __reduce_add_sync(0xffffffff) in a warp of 8 "
                               "threads names lanes it does not have");
  expect_fault<&faulty_kernel>(dim3(1), dim3(32), FaultParams{b, 4},
                               "a 16-byte load (float4) from an address that is not a multiple "
                               "of 16");
  expect_fault<&faulty_kernel>(dim3(1), dim3(32), FaultParams{b, 5},
                               "a 16-byte store (uint4) to an address that is not a multiple of "
                               "16");
  expect_fault<&faulty_kernel>(dim3(1), dim3(32), FaultParams{b, 6},
                               "an atomic at an address not aligned to its size");
  expect_fault<&faulty_kernel>(dim3(1), dim3(32), FaultParams{b, 7},
                               "__reduce_add_sync(0xffffffff) names thread (16, 0, 0), which "
                               "waits in __reduce_max_sync(0xffffffff)");
  expect_fault<&faulty_kernel>(dim3(1), dim3(32), FaultParams{b, 8},
                               "an 8-byte load (uint2) from an address that is not a multiple "
                               "of 8");
  expect_fault<&faulty_kernel>(dim3(1), dim3(32), FaultParams{b, 9},
                               "an 8-byte store (uint2) to an address that is not a multiple of 8");
  EXPECT_THROW(__reduce_add_sync(0xffffffffu, 1u), KernelFault);  // outside a launch
  // The runner is usable after faults (their warps' suspended threads were dropped).
  std::vector<unsigned> out(64 * 2, 0);
  launch<&reduce_kernel>(dim3(1), dim3(64),
                         ReduceParams{reinterpret_cast<std::uint64_t>(out.data()), 0});
  EXPECT_EQ(out[0], 32u * 33u / 2u);
  EXPECT_EQ(out[2 * 32], (33u + 64u) * 32u / 2u);
}

// --- Atomics and vector types --------------------------------------------------------------------

struct AtomicParams {
  std::uint64_t counter;
  std::uint64_t olds;
};

__global__ void atomic_kernel(AtomicParams p) {
  const unsigned long long old = atomicAdd(reinterpret_cast<unsigned long long*>(p.counter), 1ull);
  reinterpret_cast<unsigned*>(p.olds)[blockIdx.x * blockDim.x + threadIdx.x] =
      static_cast<unsigned>(old);
}

TEST(HostCudaTest, AtomicAddReturnsTheOldValue) {
  unsigned long long counter = 100;
  std::vector<unsigned> olds(5 * 64);
  launch<&atomic_kernel>(dim3(5), dim3(64),
                         AtomicParams{reinterpret_cast<std::uint64_t>(&counter),
                                      reinterpret_cast<std::uint64_t>(olds.data())});
  EXPECT_EQ(counter, 100u + 5 * 64);
  std::sort(olds.begin(), olds.end());
  for (unsigned i = 0; i < olds.size(); ++i) ASSERT_EQ(olds[i], 100 + i);
}

struct CopyParams {
  std::uint64_t src;
  std::uint64_t dst;
};

// Copies 16-bit data as uint4 and floats as float4, as the Adam kernel's vector path does.
__global__ void vector_copy(CopyParams p) {
  const unsigned i = threadIdx.x;
  reinterpret_cast<uint4*>(p.dst)[i] = reinterpret_cast<const uint4*>(p.src)[i];
  const float4 f = reinterpret_cast<const float4*>(p.src)[i + 32];
  reinterpret_cast<float4*>(p.dst)[i + 32] = make_float4(f.w, f.z, f.y, f.x);
}

TEST(HostCudaTest, VectorLoadsAndStoresMoveSixteenBytes) {
  alignas(16) std::uint16_t src[64 * 8], dst[64 * 8] = {};
  for (unsigned i = 0; i < 64 * 8; ++i) src[i] = static_cast<std::uint16_t>(i * 7919u);
  launch<&vector_copy>(
      dim3(1), dim3(32),
      CopyParams{reinterpret_cast<std::uint64_t>(src), reinterpret_cast<std::uint64_t>(dst)});
  EXPECT_EQ(std::memcmp(src, dst, 32 * 16), 0);
  const auto* s = reinterpret_cast<const std::uint32_t*>(src);
  const auto* d = reinterpret_cast<const std::uint32_t*>(dst);
  for (unsigned v = 32; v < 64; ++v) {
    for (unsigned k = 0; k < 4; ++k) ASSERT_EQ(d[v * 4 + k], s[v * 4 + 3 - k]) << v;
  }
}

// --- fp16 and bf16 against NVIDIA's definitions
// ---------------------------------------------------

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

TEST(HostCudaTest, HalfToFloatIsTheDevicesForEveryPattern) {
  for (std::uint32_t u = 0; u < 0x10000u; ++u) {
    const auto h = static_cast<std::uint16_t>(u);
    ASSERT_EQ(__half_as_ushort(__ushort_as_half(h)), h);
    ASSERT_EQ(bits(__half2float(__ushort_as_half(h))), bits(nvidia_half2float(h)))
        << std::hex << "half 0x" << u;
  }
}

// tide's kernels round to fp16/bf16 with kernels/dtype.h's functions on the device and on the CPU
// alike (the same code). For numbers they equal the device's own round-to-nearest-even
// intrinsics, so a kernel could use either; for NaN both give a quiet NaN, tide's keeping the
// sign and the payload's top bits, the intrinsics a canonical one.
TEST(HostCudaTest, TidesRoundingEqualsTheDevicesIntrinsicsForNumbers) {
  std::vector<float> values;
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    // Every fp16 value, its neighbours in fp32, the midpoint to the next fp16 and around it.
    const float f = fp16_to_float(static_cast<std::uint16_t>(h));
    const float next = fp16_to_float(static_cast<std::uint16_t>(h + 1));
    const float mid = static_cast<float>((static_cast<double>(f) + next) / 2);
    for (float x : {f, mid}) {
      values.push_back(x);
      values.push_back(std::nextafter(x, 0.0f));
      values.push_back(std::nextafter(x, 2 * x));
    }
    // bf16: the patterns that decide rounding in the low half.
    for (std::uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      values.push_back(bits_float(h << 16 | low));
    }
  }
  for (float x : values) {
    const std::uint16_t half = float_to_fp16(x), bf = float_to_bf16(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(fp16_to_float(half)) && std::isnan(bf16_to_float(bf)));
      ASSERT_TRUE(std::isnan(fp16_to_float(nvidia_float2half_rn(x))));
      continue;
    }
    ASSERT_EQ(half, nvidia_float2half_rn(x)) << std::hex << "fp16 of 0x" << bits(x);
    ASSERT_EQ(bf, nvidia_float2bfloat16_rn(x)) << std::hex << "bf16 of 0x" << bits(x);
  }
}

// --- The registry --------------------------------------------------------------------------------

TEST(HostCudaTest, TidesKernelsAreRegisteredByName) {
  for (const char* name : {"tide_adam_step", "tide_adam_step_q8", "tide_cast_f32_to_half"}) {
    const HostKernelEntry* entry = find_host_kernel(name);
    ASSERT_NE(entry, nullptr) << name;
    EXPECT_EQ(entry->name, name);
    EXPECT_NE(entry->thread, nullptr);
    EXPECT_GT(entry->param_bytes, 0u);
  }
  EXPECT_EQ(find_host_kernel("no_such_kernel"), nullptr);
}

}  // namespace
}  // namespace tide::kernels::testing
