// The stand-in configured by the environment (tests/standin/CMakeLists.txt sets it):
// TIDE_STANDIN_DEVICES=2 TIDE_STANDIN_MEMORY=64MiB TIDE_STANDIN_H2D_GBPS=0.02
// TIDE_STANDIN_D2H_GBPS=0.01 TIDE_STANDIN_FAIL_ALLOC=3 TIDE_STANDIN_FAIL_COPY=2.
// The faults count from the start of the process, so that test comes first (gtest keeps the
// order of a file).
#include <cstring>
#include <vector>

#include "tests/standin/standin_test.h"

namespace tide::standin::test {
namespace {

class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cuInit(0), CUDA_SUCCESS); }

  static CUcontext retain(int device) {
    CUcontext context = nullptr;
    EXPECT_EQ(cuDevicePrimaryCtxRetain(&context, device), CUDA_SUCCESS);
    return context;
  }
};

TEST_F(EnvTest, FaultsCountFromTheStartOfTheProcess) {
  ASSERT_EQ(cuCtxSetCurrent(retain(0)), CUDA_SUCCESS);
  CUdeviceptr p[4] = {};
  EXPECT_EQ(cuMemAlloc(&p[0], 256), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&p[1], 256), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&p[2], 256), CUDA_ERROR_OUT_OF_MEMORY);  // the 3rd
  EXPECT_EQ(cuMemAlloc(&p[3], 256), CUDA_SUCCESS);
  std::vector<std::uint8_t> host(256, 1);
  EXPECT_EQ(cuMemcpyHtoD(p[0], host.data(), 256), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyHtoD(p[0], host.data(), 256), CUDA_ERROR_LAUNCH_FAILED);  // the 2nd
  EXPECT_EQ(cuMemcpyHtoD(p[0], host.data(), 256), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(p[0]), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(p[1]), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(p[3]), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

TEST_F(EnvTest, TwoDevicesEachWithItsOwnCapacityAndContext) {
  int count = 0;
  ASSERT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
  ASSERT_EQ(count, 2);
  char name[64];
  ASSERT_EQ(cuDeviceGetName(name, sizeof name, 1), CUDA_SUCCESS);
  EXPECT_STREQ(name, "tide stand-in device 1");
  for (int device = 0; device < 2; ++device) {
    std::size_t total = 0;
    ASSERT_EQ(cuDeviceTotalMem(&total, device), CUDA_SUCCESS);
    EXPECT_EQ(total, 64u << 20);
  }
  const CUcontext first = retain(0);
  const CUcontext second = retain(1);
  EXPECT_NE(first, second);

  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  CUdeviceptr c = 0;
  ASSERT_EQ(cuCtxSetCurrent(first), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc(&a, 48 << 20), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(second), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc(&b, 48 << 20), CUDA_SUCCESS);  // device 1 has its own 64 MiB
  EXPECT_EQ(cuMemAlloc(&c, 48 << 20), CUDA_ERROR_OUT_OF_MEMORY);
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  ASSERT_EQ(cuMemGetInfo(&free_bytes, &total), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes, 16u << 20);
  int ordinal = -1;
  ASSERT_EQ(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, b), CUDA_SUCCESS);
  EXPECT_EQ(ordinal, 1);

  // Streams of device 1 run its work.
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD8Async(b, 0x3c, 4096, stream), CUDA_SUCCESS);
  std::vector<std::uint8_t> out(4096);
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoH(out.data(), b, out.size()), CUDA_SUCCESS);
  EXPECT_EQ(out, std::vector<std::uint8_t>(4096, 0x3c));
  ASSERT_EQ(cuStreamDestroy(stream), CUDA_SUCCESS);

  // Releasing device 1's context frees its memory, not device 0's.
  ASSERT_EQ(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
  std::uint64_t used = 0;
  ASSERT_EQ(tide_standin_device_memory(1, &used, nullptr, nullptr), 0);
  EXPECT_EQ(used, 0u);
  ASSERT_EQ(tide_standin_device_memory(0, &used, nullptr, nullptr), 0);
  EXPECT_EQ(used, 48u << 20);
  ASSERT_EQ(cuCtxSetCurrent(first), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(a), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
}

TEST_F(EnvTest, BandwidthComesFromTheEnvironment) {
  ASSERT_EQ(cuCtxSetCurrent(retain(0)), CUDA_SUCCESS);
  constexpr std::size_t kBytes = 1 << 20;  // 52 ms up at 20 MB/s, 105 ms down at 10 MB/s
  std::vector<std::uint8_t> host(kBytes, 1);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc(&p, kBytes), CUDA_SUCCESS);
  auto start = Clock::now();
  ASSERT_EQ(cuMemcpyHtoD(p, host.data(), kBytes), CUDA_SUCCESS);
  const double up = seconds_since(start);
  start = Clock::now();
  ASSERT_EQ(cuMemcpyDtoH(host.data(), p, kBytes), CUDA_SUCCESS);
  const double down = seconds_since(start);
  EXPECT_GE(up, kBytes / 0.02e9 * 0.95);
  EXPECT_GE(down, kBytes / 0.01e9 * 0.95);
  EXPECT_LT(up, down);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
}

}  // namespace
}  // namespace tide::standin::test
