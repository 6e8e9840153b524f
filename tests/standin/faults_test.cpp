// Fault injection through the control API (the environment's knobs: env_*_test.cpp).
#include <cstring>
#include <vector>

#include "tests/standin/standin_test.h"

namespace tide::standin::test {
namespace {

using FaultsTest = StandinTest;

TEST_F(FaultsTest, TheNthAllocationFailsOnce) {
  const tide_standin_stats before = stats();
  ASSERT_EQ(tide_standin_fail_alloc(2), 0);
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  CUdeviceptr c = 0;
  ASSERT_EQ(cuMemAlloc(&a, 256), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&b, 256), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(cuMemAlloc(&c, 256), CUDA_SUCCESS);
  EXPECT_EQ(stats().injected_faults - before.injected_faults, 1u);
  EXPECT_EQ(cuMemFree(a), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(c), CUDA_SUCCESS);

  // cuMemCreate counts as a device allocation too.
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemGenericAllocationHandle handle = 0;
  ASSERT_EQ(tide_standin_fail_alloc(1), 0);
  EXPECT_EQ(cuMemCreate(&handle, 2 << 20, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(cuMemCreate(&handle, 2 << 20, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemRelease(handle), CUDA_SUCCESS);

  // Disarmed.
  ASSERT_EQ(tide_standin_fail_alloc(2), 0);
  ASSERT_EQ(tide_standin_fail_alloc(0), 0);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(cuMemAlloc(&a, 256), CUDA_SUCCESS);
    EXPECT_EQ(cuMemFree(a), CUDA_SUCCESS);
  }
}

TEST_F(FaultsTest, TheNthCopyFailsWhenEnqueuedAndCopiesNothing) {
  DeviceBuffer buffer(4096);
  ASSERT_EQ(cuMemsetD8Async(buffer.get(), 0, 4096, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);  // the stream below is non-blocking
  PinnedVector host(4096, 9);
  Stream stream;
  ASSERT_EQ(tide_standin_fail_copy(2), 0);
  ASSERT_EQ(cuMemcpyDtoHAsync(host.data(), buffer.get(), 16, stream.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
  std::fill(host.vector().begin(), host.vector().end(), 9);
  EXPECT_EQ(cuMemcpyHtoDAsync(buffer.get(), host.data(), 4096, stream.get()),
            CUDA_ERROR_LAUNCH_FAILED);
  // The stream is not poisoned; the failed copy never ran.
  ASSERT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
  std::vector<std::uint8_t> device(4096, 1);
  ASSERT_EQ(cuMemcpyDtoH(device.data(), buffer.get(), 4096), CUDA_SUCCESS);
  EXPECT_EQ(device, std::vector<std::uint8_t>(4096, 0));
  // Synchronous copies count too.
  ASSERT_EQ(tide_standin_fail_copy(1), 0);
  EXPECT_EQ(cuMemcpyHtoD(buffer.get(), host.data(), 4096), CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(cuMemcpyHtoD(buffer.get(), host.data(), 4096), CUDA_SUCCESS);
}

TEST_F(FaultsTest, ALostDeviceFailsEveryCallUntilRestored) {
  ASSERT_EQ(tide_standin_device_lost(3), 0);
  int count = 0;
  int version = 0;
  EXPECT_EQ(cuDriverGetVersion(&version), CUDA_SUCCESS);  // 1st
  EXPECT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);      // 2nd
  EXPECT_EQ(cuDeviceGetCount(&count), CUDA_ERROR_DEVICE_UNAVAILABLE);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc(&p, 256), CUDA_ERROR_DEVICE_UNAVAILABLE);
  EXPECT_EQ(cuStreamSynchronize(nullptr), CUDA_ERROR_DEVICE_UNAVAILABLE);
  EXPECT_EQ(cuInit(0), CUDA_ERROR_DEVICE_UNAVAILABLE);
  // The error can still be named, and functions still found.
  const char* name = nullptr;
  EXPECT_EQ(cuGetErrorName(CUDA_ERROR_DEVICE_UNAVAILABLE, &name), CUDA_SUCCESS);
  EXPECT_STREQ(name, "CUDA_ERROR_DEVICE_UNAVAILABLE");
  void* fn = nullptr;
  EXPECT_EQ(cuGetProcAddress("cuInit", &fn, 12000, 0, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(tide_standin_device_lost(0), 0);
  EXPECT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
}

TEST_F(FaultsTest, StatisticsAreReadableByName) {
  const tide_standin_stats before = stats();
  std::uint64_t allocs = 0;
  ASSERT_EQ(tide_standin_stat("device_allocs", &allocs), 0);
  EXPECT_EQ(allocs, before.device_allocs);
  std::uint64_t in_use = 0;
  ASSERT_EQ(tide_standin_stat("device_bytes_in_use", &in_use), 0);
  EXPECT_EQ(in_use, before.device_bytes_in_use);
  EXPECT_EQ(tide_standin_stat("no_such_stat", &allocs), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(tide_standin_stat(nullptr, &allocs), CUDA_ERROR_INVALID_VALUE);

  DeviceBuffer buffer(1 << 20);
  tide_standin_reset_stats();
  const tide_standin_stats reset = stats();
  EXPECT_EQ(reset.device_allocs, 0u);
  EXPECT_EQ(reset.driver_calls, 0u);
  EXPECT_GE(reset.device_bytes_in_use, 1u << 20);  // gauges stay
  EXPECT_EQ(reset.device_bytes_peak, reset.device_bytes_in_use);
}

}  // namespace
}  // namespace tide::standin::test
