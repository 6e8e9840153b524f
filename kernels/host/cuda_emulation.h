// CUDA on the host: what a kernel of kernels/cuda/ needs to compile as host C++ and run on the
// CPU, thread by thread, over a launch's grid (kernels/host/grid.h runs it). A host translation
// unit includes this header, then the kernel's .cu file (kernels/adam_host.cpp).
//
// Everything here computes what the device computes, bit for bit: the _rn intrinsics are the
// IEEE-754 operations rounded once (the host kernels are built with -ffp-contract=off), fp16
// conversions are in kernels/host/include/cuda_fp16.h, and the warp collectives are real ones (the
// threads of a warp run as fibers and meet in it). Where the device would fault or leave the
// result undefined, this is stricter: a 16-byte vector access at an address that is not a multiple
// of 16, an atomic at a misaligned address, or a warp collective that not every named thread
// reaches with the same mask fails the launch (KernelFault) instead of running on.
//
// What is not emulated is refused at compile time: shared memory (__shared__) and block barriers
// (__syncthreads), constant memory (__constant__). Intrinsics and vector types not declared here
// are compile errors too: add them here, with a test against the device's definition
// (tests/kernels/host_cuda_test.cpp), when a kernel needs one.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#define TIDE_CUDA_HOST 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __grid_constant__
#define __launch_bounds__(...)
#define __shared__                                                                             \
  static_assert(                                                                               \
      false,                                                                                   \
      "kernels/host/cuda_emulation.h does not emulate __shared__ memory: a kernel that needs " \
      "it must run its block's threads with barriers (kernels/host/grid.h)");
#define __constant__ \
  static_assert(false, "kernels/host/cuda_emulation.h does not emulate __constant__ memory");
#define __syncthreads()                                                                        \
  static_assert(false,                                                                         \
                "kernels/host/cuda_emulation.h does not run __syncthreads(): the host runner " \
                "suspends threads at warp collectives only (kernels/host/grid.h)")

struct uint3 {
  unsigned x, y, z;
};

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3() = default;
  constexpr dim3(unsigned vx, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr explicit dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

namespace tide::kernels::host {

// The built-in variables of the kernel thread that runs on this OS thread: the runner sets them
// before it runs or resumes a thread.
struct Builtins {
  uint3 thread_idx;
  uint3 block_idx;
  uint3 block_dim;
  uint3 grid_dim;
};
inline constinit thread_local Builtins builtins{};

// Throws KernelFault (kernels/host/grid.h): the launch fails, naming the thread.
[[noreturn]] void fault(const char* what);

// The warp collectives of the calling kernel thread (kernels/host/grid.cpp): the threads a mask
// names must all reach the same one.
enum class WarpOp : unsigned char { kAdd, kMax };
unsigned warp_reduce(WarpOp op, unsigned mask, unsigned value);

inline void require_aligned(const void* address, std::uintptr_t bytes, const char* what) {
  if (reinterpret_cast<std::uintptr_t>(address) % bytes != 0) fault(what);
}

}  // namespace tide::kernels::host

#define threadIdx (static_cast<const uint3&>(::tide::kernels::host::builtins.thread_idx))
#define blockIdx (static_cast<const uint3&>(::tide::kernels::host::builtins.block_idx))
#define blockDim (dim3(::tide::kernels::host::builtins.block_dim))
#define gridDim (dim3(::tide::kernels::host::builtins.grid_dim))
#define warpSize 32

// 16-byte vector types. A load or store of one through memory is one 16-byte access on the
// device, which faults unless the address is a multiple of 16: copying from or assigning to one
// here checks the same (the host would read a misaligned address without complaint). The bytes
// move with memcpy, so that reading 16-bit data as uint4 is no aliasing violation.
#define TIDE_CUDA_HOST_VECTOR16(Name, T)                                        \
  struct alignas(16) Name {                                                     \
    T x, y, z, w;                                                               \
    Name() = default;                                                           \
    constexpr Name(T vx, T vy, T vz, T vw) : x(vx), y(vy), z(vz), w(vw) {}      \
    Name(const Name& other) {                                                   \
      ::tide::kernels::host::require_aligned(&other, 16,                        \
                                             "a 16-byte load (" #Name           \
                                             ") from an address that is not a " \
                                             "multiple of 16");                 \
      std::memcpy(static_cast<void*>(this), &other, sizeof(Name));              \
    }                                                                           \
    Name& operator=(const Name& other) {                                        \
      ::tide::kernels::host::require_aligned(this, 16,                          \
                                             "a 16-byte store (" #Name          \
                                             ") to an address that is not a "   \
                                             "multiple of 16");                 \
      std::memcpy(static_cast<void*>(this), &other, sizeof(Name));              \
      return *this;                                                             \
    }                                                                           \
  };                                                                            \
  static_assert(sizeof(Name) == 16);

TIDE_CUDA_HOST_VECTOR16(float4, float)
TIDE_CUDA_HOST_VECTOR16(uint4, unsigned)
#undef TIDE_CUDA_HOST_VECTOR16

// The 8-byte vector: one 8-byte access on the device, which faults unless the address is a
// multiple of 8.
struct alignas(8) uint2 {
  unsigned x, y;
  uint2() = default;
  constexpr uint2(unsigned vx, unsigned vy) : x(vx), y(vy) {}
  uint2(const uint2& other) {
    ::tide::kernels::host::require_aligned(
        &other, 8, "an 8-byte load (uint2) from an address that is not a multiple of 8");
    std::memcpy(static_cast<void*>(this), &other, sizeof(uint2));
  }
  uint2& operator=(const uint2& other) {
    ::tide::kernels::host::require_aligned(
        this, 8, "an 8-byte store (uint2) to an address that is not a multiple of 8");
    std::memcpy(static_cast<void*>(this), &other, sizeof(uint2));
    return *this;
  }
};
static_assert(sizeof(uint2) == 8);
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2(x, y); }

inline float4 make_float4(float x, float y, float z, float w) { return float4(x, y, z, w); }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return uint4(x, y, z, w);
}

// Arithmetic rounded once to nearest even, never contracted: what the device's _rn intrinsics
// compute.
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
using std::isfinite;

// The sum over the threads named in `mask`, which must all call it with the same mask; every one
// of them gets the sum. Two's complement: the int form wraps as the device's does.
inline unsigned __reduce_add_sync(unsigned mask, unsigned value) {
  return ::tide::kernels::host::warp_reduce(::tide::kernels::host::WarpOp::kAdd, mask, value);
}
inline int __reduce_add_sync(unsigned mask, int value) {
  return static_cast<int>(::tide::kernels::host::warp_reduce(::tide::kernels::host::WarpOp::kAdd,
                                                             mask, static_cast<unsigned>(value)));
}
// The maximum over the threads named in `mask` (unsigned only: the int form orders differently).
inline unsigned __reduce_max_sync(unsigned mask, unsigned value) {
  return ::tide::kernels::host::warp_reduce(::tide::kernels::host::WarpOp::kMax, mask, value);
}

// Atomics return the old value, as on the device; the address must be aligned to the size.
template <typename T>
inline T tide_cuda_host_atomic_add(T* address, T value) {
  ::tide::kernels::host::require_aligned(address, sizeof(T),
                                         "an atomic at an address not aligned to its size");
  return std::atomic_ref<T>(*address).fetch_add(value, std::memory_order_relaxed);
}
inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
  return tide_cuda_host_atomic_add(address, value);
}
inline unsigned atomicAdd(unsigned* address, unsigned value) {
  return tide_cuda_host_atomic_add(address, value);
}
inline int atomicAdd(int* address, int value) { return tide_cuda_host_atomic_add(address, value); }

namespace tide::kernels::host {

// The parameter type of a kernel `void kernel(P)`.
template <typename F>
struct KernelParameter;
template <typename P>
struct KernelParameter<void (*)(P)> {
  using type = std::remove_cvref_t<P>;
};

// One kernel thread of `Kernel`: the kernel called with the launch's parameters (which it takes
// by value, as every tide kernel does).
template <auto Kernel>
void kernel_thread(const void* params) {
  using P = typename KernelParameter<decltype(Kernel)>::type;
  static_assert(std::is_trivially_copyable_v<P>, "kernel parameters travel as bytes");
  Kernel(*static_cast<const P*>(params));
}

}  // namespace tide::kernels::host
