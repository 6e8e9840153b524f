// Device memory: allocation, capacity, cuMemGetInfo, pointer attributes.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "tests/standin/standin_test.h"

namespace tide::standin::test {
namespace {

class MemoryTest : public StandinTest {
 protected:
  void TearDown() override {
    tide_standin_set_capacity(0, std::uint64_t{8} << 30);
    StandinTest::TearDown();
  }
};

// Resident memory of this process, from /proc.
std::size_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0;
  unsigned long resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE)) : 0;
}

TEST_F(MemoryTest, AllocationsAreAlignedUsableAndCounted) {
  const tide_standin_stats before = stats();
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  ASSERT_EQ(cuMemAlloc(&a, 1000), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc(&b, 3), CUDA_SUCCESS);
  EXPECT_EQ(a % 256, 0u);
  EXPECT_EQ(b % 256, 0u);
  EXPECT_NE(a, b);
  // Host-backed: the test may look at the bytes directly.
  std::memset(reinterpret_cast<void*>(a), 0x5a, 1000);
  const tide_standin_stats during = stats();
  EXPECT_EQ(during.device_allocs - before.device_allocs, 2u);
  EXPECT_EQ(during.device_bytes_in_use - before.device_bytes_in_use, 1003u);
  EXPECT_GE(during.device_bytes_peak, during.device_bytes_in_use);
  EXPECT_EQ(cuMemFree(a), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(b), CUDA_SUCCESS);
  const tide_standin_stats after = stats();
  EXPECT_EQ(after.device_frees - before.device_frees, 2u);
  EXPECT_EQ(after.device_bytes_in_use, before.device_bytes_in_use);
}

TEST_F(MemoryTest, BadArgumentsAndUnknownPointersAreInvalidValues) {
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAlloc(nullptr, 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFree(0), CUDA_SUCCESS);  // as CUDA: nothing to free
  EXPECT_EQ(cuMemFree(0xdead0000), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuMemAlloc(&p, 4096), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(p + 256), CUDA_ERROR_INVALID_VALUE);  // not the start
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);  // twice
}

TEST_F(MemoryTest, LargeAllocationsDoNotTouchTheirPages) {
  const std::size_t before = resident_bytes();
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc(&p, std::size_t{4} << 30), CUDA_SUCCESS);
  const std::size_t after = resident_bytes();
  EXPECT_LT(after, before + (std::size_t{64} << 20)) << "4 GiB allocated, resident grew";
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
}

TEST_F(MemoryTest, OutOfMemoryAtCapacityThenRecoversAfterFree) {
  ASSERT_EQ(tide_standin_set_capacity(0, 64 << 20), 0);
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  ASSERT_EQ(cuMemGetInfo(&free_bytes, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, 64u << 20);
  EXPECT_EQ(free_bytes, 64u << 20);

  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  CUdeviceptr c = 0;
  ASSERT_EQ(cuMemAlloc(&a, 40 << 20), CUDA_SUCCESS);
  ASSERT_EQ(cuMemGetInfo(&free_bytes, &total), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes, 24u << 20);
  EXPECT_EQ(cuMemAlloc(&b, 32 << 20), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(b, 0u);
  ASSERT_EQ(cuMemAlloc(&c, 24 << 20), CUDA_SUCCESS);  // exactly the rest
  ASSERT_EQ(cuMemGetInfo(&free_bytes, &total), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes, 0u);
  EXPECT_EQ(cuMemAlloc(&b, 1), CUDA_ERROR_OUT_OF_MEMORY);

  ASSERT_EQ(cuMemFree(a), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc(&b, 32 << 20), CUDA_SUCCESS);  // fits again
  ASSERT_EQ(cuMemGetInfo(&free_bytes, &total), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes, 8u << 20);
  std::uint64_t used = 0;
  std::uint64_t peak = 0;
  std::uint64_t capacity = 0;
  ASSERT_EQ(tide_standin_device_memory(0, &used, &peak, &capacity), 0);
  EXPECT_EQ(used, 56u << 20);
  EXPECT_GE(peak, 64u << 20);
  EXPECT_EQ(capacity, 64u << 20);
  EXPECT_EQ(cuMemFree(b), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(c), CUDA_SUCCESS);
  EXPECT_EQ(tide_standin_device_memory(3, &used, &peak, &capacity), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(MemoryTest, FreeWaitsForWorkStillUsingTheBuffer) {
  // A slow copy into the buffer is queued; freeing it must not pull the pages from under it.
  ASSERT_EQ(tide_standin_set_bandwidth(0.01, 0), 0);  // 1 MiB: about 100 ms
  PinnedVector host(1 << 20, 3);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc(&p, host.size()), CUDA_SUCCESS);
  Stream stream;
  ASSERT_EQ(cuMemcpyHtoDAsync(p, host.data(), host.size(), stream.get()), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(stream.get()), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(stream.get()), CUDA_SUCCESS);
}

TEST_F(MemoryTest, StreamOrderedAllocationFreesInStreamOrder) {
  Stream stream;
  CUdeviceptr p = 0;
  const tide_standin_stats before = stats();
  ASSERT_EQ(cuMemAllocAsync(&p, 1 << 20, stream.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD8Async(p, 0x11, 1 << 20, stream.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuMemFreeAsync(p, stream.get()), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeAsync(p, stream.get()), CUDA_ERROR_INVALID_VALUE);  // twice
  ASSERT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
  const tide_standin_stats after = stats();
  EXPECT_EQ(after.device_allocs - before.device_allocs, 1u);
  EXPECT_EQ(after.device_frees - before.device_frees, 1u);
  EXPECT_EQ(after.device_bytes_in_use, before.device_bytes_in_use);
}

TEST_F(MemoryTest, PointerAttributesDescribeDeviceAndHostMemory) {
  DeviceBuffer buffer(1 << 16);
  unsigned type = 0;
  ASSERT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, buffer.get() + 100),
            CUDA_SUCCESS);
  EXPECT_EQ(type, CU_MEMORYTYPE_DEVICE);
  CUdeviceptr start = 0;
  std::size_t size = 0;
  int ordinal = -1;
  CUcontext owner = nullptr;
  ASSERT_EQ(
      cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, buffer.get() + 100),
      CUDA_SUCCESS);
  ASSERT_EQ(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, buffer.get() + 100),
            CUDA_SUCCESS);
  ASSERT_EQ(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, buffer.get()),
            CUDA_SUCCESS);
  ASSERT_EQ(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, buffer.get()),
            CUDA_SUCCESS);
  EXPECT_EQ(start, buffer.get());
  EXPECT_EQ(size, buffer.size());
  EXPECT_EQ(ordinal, 0);
  EXPECT_EQ(owner, context_);

  PinnedVector host(4096);
  ASSERT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  reinterpret_cast<CUdeviceptr>(host.data())),
            CUDA_SUCCESS);
  EXPECT_EQ(type, CU_MEMORYTYPE_HOST);
  std::vector<char> pageable(64);
  EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  reinterpret_cast<CUdeviceptr>(pageable.data())),
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(MemoryTest, LegacyEntryPointsUse32BitPointersAndSizes) {
  // What a CUDA 2.x program gets from dlsym("cuMemAlloc"): 32-bit device pointers and sizes.
  using LegacyAlloc = CUresult (*)(unsigned int*, unsigned int);
  using LegacyFree = CUresult (*)(unsigned int);
  using LegacyInfo = CUresult (*)(unsigned int*, unsigned int*);
  void* alloc_fn = nullptr;
  void* free_fn = nullptr;
  void* info_fn = nullptr;
  ASSERT_EQ(cuGetProcAddress("cuMemAlloc", &alloc_fn, 2000, 0, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuGetProcAddress("cuMemFree", &free_fn, 2000, 0, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuGetProcAddress("cuMemGetInfo", &info_fn, 2000, 0, nullptr), CUDA_SUCCESS);
  unsigned int p = 0;
  ASSERT_EQ(reinterpret_cast<LegacyAlloc>(alloc_fn)(&p, 4096), CUDA_SUCCESS);
  EXPECT_NE(p, 0u);
  std::memset(reinterpret_cast<void*>(std::uintptr_t{p}), 1, 4096);
  unsigned int free_bytes = 0;
  unsigned int total = 0;
  ASSERT_EQ(reinterpret_cast<LegacyInfo>(info_fn)(&free_bytes, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, 0xffffffffu);  // 8 GiB does not fit: saturated
  EXPECT_EQ(reinterpret_cast<LegacyFree>(free_fn)(p), CUDA_SUCCESS);
}

}  // namespace
}  // namespace tide::standin::test
