// TIDE_MEMORY_LIMIT=64MiB (set by ctest): cuMemGetInfo and cuDeviceTotalMem report the limit,
// and allocations beyond it fail with CUDA_ERROR_OUT_OF_MEMORY without reaching the driver, per
// device, whatever the entry point, also under concurrent allocation.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "preload_test_support.h"

namespace tide::interpose::test {
namespace {

constexpr size_t kMiB = 1 << 20;
constexpr size_t kLimit = 64 * kMiB;

using MemAlloc = CUresult (*)(CUdeviceptr*, size_t);
using MemFree = CUresult (*)(CUdeviceptr);
using MemGetInfo = CUresult (*)(size_t*, size_t*);
using DeviceTotalMem = CUresult (*)(size_t*, CUdevice);
using MemCreate = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                               unsigned long long);
using MemRelease = CUresult (*)(CUmemGenericAllocationHandle);
using MemAllocAsync = CUresult (*)(CUdeviceptr*, size_t, CUstream);
using MemFreeAsync = CUresult (*)(CUdeviceptr, CUstream);

template <typename Fn>
Fn hooked(const char* name) {
  return reinterpret_cast<Fn>(dlsym(fake_driver().handle, name));
}

class Limit : public ::testing::Test {
 protected:
  void SetUp() override {
    expect_setup();
    alloc_ = hooked<MemAlloc>("cuMemAlloc_v2");
    free_ = hooked<MemFree>("cuMemFree_v2");
  }
  MemAlloc alloc_ = nullptr;
  MemFree free_ = nullptr;
};

TEST_F(Limit, MemGetInfoAndTotalMemReportTheLimit) {
  size_t free_bytes = 0;
  size_t total = 0;
  ASSERT_EQ(hooked<MemGetInfo>("cuMemGetInfo_v2")(&free_bytes, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, kLimit);
  EXPECT_EQ(free_bytes, kLimit);
  size_t device_total = 0;
  ASSERT_EQ(hooked<DeviceTotalMem>("cuDeviceTotalMem_v2")(&device_total, 0), CUDA_SUCCESS);
  EXPECT_EQ(device_total, kLimit);

  CUdeviceptr ptr = 0;
  ASSERT_EQ(alloc_(&ptr, 48 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(hooked<MemGetInfo>("cuMemGetInfo_v2")(&free_bytes, &total), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes, 16 * kMiB);
  EXPECT_EQ(free_(ptr), CUDA_SUCCESS);
}

TEST_F(Limit, AllocationsBeyondItFailWithOutOfMemoryBeforeTheDriver) {
  CUdeviceptr a = 0;
  ASSERT_EQ(alloc_(&a, 48 * kMiB), CUDA_SUCCESS);
  const auto rejections = stats().limit_rejections;
  const std::string last_before = fake_driver().last_call();
  CUdeviceptr b = 0;
  EXPECT_EQ(alloc_(&b, 32 * kMiB), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(b, 0u);
  EXPECT_EQ(fake_driver().last_call(), last_before) << "the driver was not asked";
  EXPECT_EQ(stats().limit_rejections, rejections + 1);

  // Every allocating entry point counts against the same limit.
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemGenericAllocationHandle handle = 0;
  EXPECT_EQ(hooked<MemCreate>("cuMemCreate")(&handle, 32 * kMiB, &prop, 0),
            CUDA_ERROR_OUT_OF_MEMORY);
  CUdeviceptr c = 0;
  EXPECT_EQ(hooked<MemAllocAsync>("cuMemAllocAsync_ptsz")(&c, 32 * kMiB, nullptr),
            CUDA_ERROR_OUT_OF_MEMORY);
  // Exactly up to the limit is fine; freeing gives the room back.
  ASSERT_EQ(hooked<MemCreate>("cuMemCreate")(&handle, 16 * kMiB, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(stats().limit_used_bytes, kLimit);
  EXPECT_EQ(free_(a), CUDA_SUCCESS);
  ASSERT_EQ(hooked<MemAllocAsync>("cuMemAllocAsync")(&c, 40 * kMiB, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(hooked<MemFreeAsync>("cuMemFreeAsync")(c, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(hooked<MemRelease>("cuMemRelease")(handle), CUDA_SUCCESS);
  EXPECT_EQ(stats().limit_used_bytes, 0u);
}

TEST_F(Limit, AFailedDriverCallGivesTheReservationBack) {
  using MemAllocPitch = CUresult (*)(CUdeviceptr*, size_t*, size_t, size_t, unsigned int);
  CUdeviceptr ptr = 0;
  size_t pitch = 0;
  // Reserved under the limit, then refused by the stand-in (element size 0).
  EXPECT_EQ(hooked<MemAllocPitch>("cuMemAllocPitch_v2")(&ptr, &pitch, kMiB, 8, 0),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(alloc_(nullptr, kMiB), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(free_(0x1234000), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(stats().limit_used_bytes, 0u);
}

TEST_F(Limit, EachDeviceHasItsOwnLimit) {
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  ASSERT_EQ(alloc_(&a, 60 * kMiB), CUDA_SUCCESS);
  fake_driver().set_device(1);
  ASSERT_EQ(alloc_(&b, 60 * kMiB), CUDA_SUCCESS);
  fake_driver().set_device(0);
  EXPECT_EQ(stats(0).limit_used_bytes, 60 * kMiB);
  EXPECT_EQ(stats(1).limit_used_bytes, 60 * kMiB);
  EXPECT_EQ(free_(a), CUDA_SUCCESS);
  EXPECT_EQ(free_(b), CUDA_SUCCESS);
  EXPECT_EQ(stats(1).limit_used_bytes, 0u) << "freed from another device's context";
}

TEST_F(Limit, ConcurrentAllocationsNeverOvershoot) {
  constexpr int kThreads = 4;
  std::atomic<bool> over{false};
  std::vector<std::thread> threads;
  std::vector<std::vector<CUdeviceptr>> held(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        CUdeviceptr ptr = 0;
        const CUresult r = alloc_(&ptr, kMiB);
        if (r == CUDA_SUCCESS) {
          held[t].push_back(ptr);
        } else if (r != CUDA_ERROR_OUT_OF_MEMORY) {
          over = true;
        }
        if (stats().limit_used_bytes > kLimit) over = true;
        if (i % 3 == 2 && !held[t].empty()) {
          if (free_(held[t].back()) != CUDA_SUCCESS) over = true;
          held[t].pop_back();
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_FALSE(over.load());
  size_t total = 0;
  for (auto& list : held) {
    total += list.size();
    for (CUdeviceptr ptr : list) EXPECT_EQ(free_(ptr), CUDA_SUCCESS);
  }
  EXPECT_LE(total, 64u);
  EXPECT_EQ(stats().limit_used_bytes, 0u);
}

}  // namespace
}  // namespace tide::interpose::test
