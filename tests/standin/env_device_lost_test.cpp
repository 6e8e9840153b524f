// TIDE_STANDIN_DEVICE_LOST=N (set by tests/standin/CMakeLists.txt): from the Nth driver call of
// the process on, every call fails with CUDA_ERROR_DEVICE_UNAVAILABLE.
#include <cstdlib>

#include "tests/standin/standin_test.h"

namespace tide::standin::test {
namespace {

TEST(EnvDeviceLost, CallsFailFromTheNthOn) {
  const int n = std::atoi(std::getenv("TIDE_STANDIN_DEVICE_LOST"));
  ASSERT_GE(n, 1);
  // Call 1 is cuInit, then cuDeviceGetCount: calls before the Nth succeed, the rest fail.
  EXPECT_EQ(cuInit(0), n == 1 ? CUDA_ERROR_DEVICE_UNAVAILABLE : CUDA_SUCCESS);
  for (int call = 2; call <= n + 2; ++call) {
    int count = 0;
    EXPECT_EQ(cuDeviceGetCount(&count), call < n ? CUDA_SUCCESS : CUDA_ERROR_DEVICE_UNAVAILABLE)
        << "call " << call;
  }
  // Naming the error and finding functions still work.
  const char* name = nullptr;
  EXPECT_EQ(cuGetErrorName(CUDA_ERROR_DEVICE_UNAVAILABLE, &name), CUDA_SUCCESS);
  void* fn = nullptr;
  EXPECT_EQ(cuGetProcAddress("cuInit", &fn, 12000, 0, nullptr), CUDA_SUCCESS);
  // The control API brings the device back (once cuInit has succeeded).
  if (n > 1) {
    ASSERT_EQ(tide_standin_device_lost(0), 0);
    int count = 0;
    EXPECT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
  }
}

}  // namespace
}  // namespace tide::standin::test
