// A program linked against libcuda.so.1 itself: its calls to cuMemAlloc_v2 & co. go through its
// PLT to the preload's exported hooks (which precede libcuda in the global scope), and on to the
// libcuda the program was linked with. Legacy names are not exported by the preload: they reach
// the driver directly.
#include <cuda.h>
#include <gtest/gtest.h>

#include "preload_test_support.h"

// The CUDA 3.1 ABI under its own name (cuda.h maps cuMemAlloc to cuMemAlloc_v2).
extern "C" CUresult legacy_mem_alloc(unsigned int* dptr, unsigned int bytes) __asm__("cuMemAlloc");

namespace tide::interpose::test {
namespace {

TEST(DirectLink, VersionedCallsGoThroughTheExportedHooks) {
  expect_setup();
  const auto before = stats();
  CUdeviceptr ptr = 0;
  ASSERT_EQ(cuMemAlloc(&ptr, 1 << 20), CUDA_SUCCESS);  // cuMemAlloc_v2
  EXPECT_STREQ(fake_driver().last_call(), "cuMemAlloc_v2");
  EXPECT_EQ(stats().live_bytes, before.live_bytes + (1 << 20));
  size_t free_bytes = 0;
  size_t total = 0;
  ASSERT_EQ(cuMemGetInfo(&free_bytes, &total), CUDA_SUCCESS);
  EXPECT_STREQ(fake_driver().last_call(), "cuMemGetInfo_v2");
  ASSERT_EQ(cuMemFree(ptr), CUDA_SUCCESS);  // cuMemFree_v2
  EXPECT_EQ(stats().live_bytes, before.live_bytes);
  EXPECT_EQ(cuMemFree(ptr), CUDA_ERROR_INVALID_VALUE) << "the driver's own error";
}

TEST(DirectLink, TheGlobalScopeHasThePreloadsExports) {
  expect_setup();
  EXPECT_TRUE(in_preload(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2")));
  EXPECT_TRUE(in_preload(dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2")));
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "cuMemAlloc"), fake_driver().function("cuMemAlloc"));
}

TEST(DirectLink, CuGetProcAddressCalledDirectlyReturnsHooks) {
  expect_setup();
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  ASSERT_EQ(cuGetProcAddress("cuMemAlloc", &fn, 12000, 0, &status), CUDA_SUCCESS);
  EXPECT_TRUE(in_preload(fn));
  EXPECT_EQ(fn, dlsym(fake_driver().handle, "cuMemAlloc_v2"));
}

TEST(DirectLink, LegacyNamesReachTheDriverUnhooked) {
  expect_setup();
  const auto before = stats();
  unsigned int ptr = 0;
  ASSERT_EQ(legacy_mem_alloc(&ptr, 4096), CUDA_SUCCESS);
  EXPECT_STREQ(fake_driver().last_call(), "cuMemAlloc");
  EXPECT_EQ(stats().allocations, before.allocations);
}

}  // namespace
}  // namespace tide::interpose::test
