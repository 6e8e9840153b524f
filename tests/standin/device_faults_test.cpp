// What would be a device fault on a GPU stops the stand-in's process with a message naming it
// (standin/device_faults.h): death tests, each in a process of its own.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "kernels/adam_kernel.h"
#include "kernels/cast.h"
#include "tests/standin/standin_test.h"

namespace tide::standin::test {
namespace {

class DeviceFaultsTest : public StandinTest {
 protected:
  void SetUp() override {
    GTEST_FLAG_SET(death_test_style, "threadsafe");  // the stand-in runs worker threads
    StandinTest::SetUp();
  }
};

// A stream held at a host function until the process ends: what is queued behind it is pending.
void wait_forever(void* /*unused*/) {
  std::mutex mutex;
  std::condition_variable cv;
  std::unique_lock lock(mutex);
  cv.wait_for(lock, std::chrono::seconds(30));
}

constexpr char kImage[] = "// PTX\n.entry tide_cast_f32_to_half(\n.entry tide_adam_step(\n";

CUfunction kernel(const char* name) {
  CUmodule module = nullptr;
  EXPECT_EQ(cuModuleLoadData(&module, kImage), CUDA_SUCCESS);
  CUfunction f = nullptr;
  EXPECT_EQ(cuModuleGetFunction(&f, module, name), CUDA_SUCCESS);
  return f;
}

void unmap_under_a_pending_copy() {
  constexpr std::size_t kGranularity = std::size_t{2} << 20;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemGenericAllocationHandle handle = 0;
  ASSERT_EQ(cuMemCreate(&handle, kGranularity, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr base = 0;
  ASSERT_EQ(cuMemAddressReserve(&base, kGranularity, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemMap(base, kGranularity, 0, handle, 0), CUDA_SUCCESS);
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(cuMemSetAccess(base, kGranularity, &access, 1), CUDA_SUCCESS);
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchHostFunc(stream, wait_forever, nullptr), CUDA_SUCCESS);
  static std::vector<unsigned char> host(4096, 1);
  ASSERT_EQ(cuMemHostRegister(host.data(), host.size(), 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyHtoDAsync(base + 4096, host.data(), host.size(), stream), CUDA_SUCCESS);
  cuMemUnmap(base, kGranularity);
}

TEST_F(DeviceFaultsTest, UnmappingMemoryThatAPendingCopyUsesIsAFault) {
  EXPECT_DEATH(unmap_under_a_pending_copy(),
               "device fault: cuMemUnmap of 2097152 bytes that a host-to-device copy of 4096 "
               "bytes, still pending, uses");
}

void unregister_under_a_pending_copy() {
  DeviceBuffer buffer(4096);
  static std::vector<unsigned char> host(4096, 1);
  ASSERT_EQ(cuMemHostRegister(host.data(), host.size(), 0), CUDA_SUCCESS);
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchHostFunc(stream, wait_forever, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoHAsync(host.data(), buffer.get(), host.size(), stream), CUDA_SUCCESS);
  cuMemHostUnregister(host.data());
}

TEST_F(DeviceFaultsTest, UnpinningMemoryThatAPendingCopyUsesIsAFault) {
  EXPECT_DEATH(unregister_under_a_pending_copy(),
               "device fault: cuMemHostUnregister of 4096 bytes that a device-to-host copy of "
               "4096 bytes, still pending, uses");
}

void cast_from_pageable_memory() {
  static std::vector<float> pageable(64, 1.0f);
  DeviceBuffer dst(128);
  kernels::CastParams params{reinterpret_cast<std::uint64_t>(pageable.data()), dst.get(), 64,
                             kernels::Dtype::kBFloat16};
  void* args[] = {&params};
  ASSERT_EQ(
      cuLaunchKernel(kernel(kernels::kCastKernel), 1, 1, 1, 64, 1, 1, 0, nullptr, args, nullptr),
      CUDA_SUCCESS);
  cuCtxSynchronize();
}

// Without HMM a GPU cannot address pageable host memory. (With TIDE_STANDIN_HMM it may: tide's
// CPU mode, tests/standin/copies_test.cpp.)
TEST_F(DeviceFaultsTest, AKernelGivenPageableHostMemoryIsAFault) {
  EXPECT_DEATH(cast_from_pageable_memory(),
               "device fault: kernel tide_cast_f32_to_half reads 256 bytes at 0x[0-9a-f]+, which "
               "the device cannot address");
}

void misaligned_adam() {
  DeviceBuffer memory(1 << 16), counters(64);
  // Every fp32 buffer 2 bytes past a multiple of 16: "together" to the kernel's head arithmetic,
  // which then reads floats at addresses no 16-byte vector access may use.
  const CUdeviceptr b = memory.get() + 2;
  kernels::AdamKernelParams p{};
  p.terms = kernels::AdamCoefficients{};
  p.nonfinite = counters.get();
  p.subgroup_count = 1;
  p.grad_dtype = kernels::Dtype::kFloat32;
  p.state_dtype = kernels::Dtype::kFloat32;
  p.subgroups[0] = {b, b + 4096, b + 8192, b + 12288, 0, 64, 0, 0, 0};
  void* args[] = {&p};
  ASSERT_EQ(
      cuLaunchKernel(kernel(kernels::kAdamKernel), 1, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr),
      CUDA_SUCCESS);
  cuCtxSynchronize();
}

// (In the ASan+UBSan build UBSan sees the misaligned access first, and its report ends the
// process.)
TEST_F(DeviceFaultsTest, AKernelThatWouldFaultOnTheDeviceIsAFault) {
  EXPECT_DEATH(misaligned_adam(),
               "device fault: kernel tide_adam_step: block \\(0, 0, 0\\) thread \\(0, 0, 0\\): a "
               "16-byte load \\(float4\\) from an address that is not a multiple of 16|"
               "misaligned address 0x[0-9a-f]+ for type 'const struct float4'");
}

}  // namespace
}  // namespace tide::standin::test
