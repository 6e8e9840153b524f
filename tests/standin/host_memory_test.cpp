// Page-locked host memory: registration rules, host allocations, pageable copies.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tests/standin/standin_test.h"

namespace tide::standin::test {
namespace {

using HostMemoryTest = StandinTest;

TEST_F(HostMemoryTest, RegistrationsMayNotOverlap) {
  std::vector<std::uint8_t> memory(64 << 10);
  std::uint8_t* p = memory.data();
  const tide_standin_stats before = stats();
  ASSERT_EQ(cuMemHostRegister(p + 16384, 16384, CU_MEMHOSTREGISTER_PORTABLE), CUDA_SUCCESS);
  EXPECT_EQ(stats().registered_host_bytes - before.registered_host_bytes, 16384u);
  EXPECT_EQ(cuMemHostRegister(p + 16384, 16384, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(cuMemHostRegister(p, 16385, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(cuMemHostRegister(p + 32767, 100, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(cuMemHostRegister(p + 20000, 10, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(cuMemHostRegister(p, 65536, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  // Touching but not overlapping is fine.
  ASSERT_EQ(cuMemHostRegister(p, 16384, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemHostRegister(p + 32768, 16384, 0), CUDA_SUCCESS);

  EXPECT_EQ(cuMemHostUnregister(p + 16385), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);  // inside
  EXPECT_EQ(cuMemHostUnregister(p + 49152), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(p + 16384), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(p + 32768), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);  // twice
  const tide_standin_stats after = stats();
  EXPECT_EQ(after.host_registers - before.host_registers, 3u);
  EXPECT_EQ(after.host_unregisters - before.host_unregisters, 3u);
  EXPECT_EQ(after.registered_host_bytes, before.registered_host_bytes);

  EXPECT_EQ(cuMemHostRegister(nullptr, 10, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostRegister(p, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostRegister(p, 10, 0x80), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(HostMemoryTest, HostAllocationsArePageLockedAndFreedByFreeHost) {
  void* p = nullptr;
  const tide_standin_stats before = stats();
  ASSERT_EQ(cuMemHostAlloc(&p, 100000, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, 100000);
  EXPECT_EQ(stats().host_alloc_bytes - before.host_alloc_bytes, 100000u);
  // Already page-locked.
  EXPECT_EQ(cuMemHostRegister(p, 4096, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  // Async copies from it stay asynchronous.
  DeviceBuffer buffer(100000);
  Stream stream;
  ASSERT_EQ(cuMemcpyHtoDAsync(buffer.get(), p, 100000, stream.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
  EXPECT_EQ(stats().pageable_async_copies, before.pageable_async_copies);
  std::vector<char> other(16);
  EXPECT_EQ(cuMemFreeHost(other.data()), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuMemFreeHost(p), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeHost(p), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(stats().host_alloc_bytes, before.host_alloc_bytes);
  EXPECT_EQ(cuMemHostAlloc(&p, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostAlloc(&p, 16, 0x100), CUDA_ERROR_INVALID_VALUE);
}

// As CUDA: an asynchronous copy from pageable memory returns once its source is staged (the
// caller may reuse it at once) and reaches the device later, in stream order; one to pageable
// memory returns once it is complete.
TEST_F(HostMemoryTest, PageableAsyncCopiesAreStagedOrComplete) {
  constexpr std::size_t kBytes = 1 << 20;  // 105 ms each way at 10 MB/s
  const double one = kBytes / 0.01e9;
  ASSERT_EQ(tide_standin_set_bandwidth(0.01, 0.01), 0);
  std::vector<std::uint8_t> pageable(kBytes, 3);
  DeviceBuffer buffer(kBytes);
  Stream stream;
  const tide_standin_stats before = stats();

  auto start = Clock::now();
  ASSERT_EQ(cuMemcpyHtoDAsync(buffer.get(), pageable.data(), kBytes, stream.get()), CUDA_SUCCESS);
  EXPECT_LT(seconds_since(start), one * 0.5);
  std::fill(pageable.begin(), pageable.end(), std::uint8_t{9});  // the staged copy is unaffected
  EXPECT_EQ(cuStreamQuery(stream.get()), CUDA_ERROR_NOT_READY);
  ASSERT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
  std::fill(pageable.begin(), pageable.end(), std::uint8_t{3});

  std::vector<std::uint8_t> back(kBytes, 0);
  start = Clock::now();
  ASSERT_EQ(cuMemcpyDtoHAsync(back.data(), buffer.get(), kBytes, stream.get()), CUDA_SUCCESS);
  EXPECT_GE(seconds_since(start), one * 0.95);
  EXPECT_EQ(back, pageable);  // already there, without a synchronize
  EXPECT_EQ(stats().pageable_async_copies - before.pageable_async_copies, 2u);

  // A range only partly registered is pageable too.
  ASSERT_EQ(cuMemHostRegister(pageable.data(), kBytes / 2, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyHtoDAsync(buffer.get(), pageable.data(), kBytes, stream.get()), CUDA_SUCCESS);
  EXPECT_EQ(stats().pageable_async_copies - before.pageable_async_copies, 3u);
  // The registered half is not: it takes 105 ms, the call returns at once.
  ASSERT_EQ(tide_standin_set_bandwidth(0.005, 0.005), 0);
  start = Clock::now();
  ASSERT_EQ(cuMemcpyHtoDAsync(buffer.get(), pageable.data(), kBytes / 2, stream.get()),
            CUDA_SUCCESS);
  EXPECT_LT(seconds_since(start), 0.1);
  EXPECT_EQ(cuStreamQuery(stream.get()), CUDA_ERROR_NOT_READY);
  ASSERT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
  EXPECT_EQ(stats().pageable_async_copies - before.pageable_async_copies, 3u);
  ASSERT_EQ(cuMemHostUnregister(pageable.data()), CUDA_SUCCESS);
}

TEST_F(HostMemoryTest, RegistrationsGoWithTheirContext) {
  std::vector<std::uint8_t> memory(4096);
  ASSERT_EQ(cuMemHostRegister(memory.data(), memory.size(), 0), CUDA_SUCCESS);
  const tide_standin_stats before = stats();
  // Destroy the context (the fixture's reference is the only one), then start a new one.
  ASSERT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  CUcontext again = nullptr;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&again, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(again), CUDA_SUCCESS);
  EXPECT_EQ(before.registered_host_bytes - stats().registered_host_bytes, 4096u);
  EXPECT_EQ(cuMemHostRegister(memory.data(), memory.size(), 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(memory.data()), CUDA_SUCCESS);
}

}  // namespace
}  // namespace tide::standin::test
