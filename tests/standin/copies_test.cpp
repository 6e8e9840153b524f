// Copies and memset: data, ordering with the default stream, validation, simulated bandwidth.
#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "tests/standin/standin_test.h"

namespace tide::standin::test {
namespace {

using CopiesTest = StandinTest;

TEST_F(CopiesTest, SyncCopiesRoundTripAndAreCounted) {
  std::vector<std::uint32_t> in(10000);
  std::iota(in.begin(), in.end(), 7u);
  std::vector<std::uint32_t> out(in.size(), 0);
  const std::size_t bytes = in.size() * sizeof(std::uint32_t);
  DeviceBuffer a(bytes);
  DeviceBuffer b(bytes);
  const tide_standin_stats before = stats();
  ASSERT_EQ(cuMemcpyHtoD(a.get(), in.data(), bytes), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoDAsync(b.get(), a.get(), bytes, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoH(out.data(), b.get(), bytes), CUDA_SUCCESS);  // after the DtoD: same stream
  EXPECT_EQ(in, out);
  const tide_standin_stats after = stats();
  EXPECT_EQ(after.copies_h2d - before.copies_h2d, 1u);
  EXPECT_EQ(after.copies_d2d - before.copies_d2d, 1u);
  EXPECT_EQ(after.copies_d2h - before.copies_d2h, 1u);
  EXPECT_EQ(after.bytes_h2d - before.bytes_h2d, bytes);
  EXPECT_EQ(after.bytes_d2h - before.bytes_d2h, bytes);
  EXPECT_EQ(after.bytes_d2d - before.bytes_d2d, bytes);
  // Sync copies from pageable memory are not "pageable async copies".
  EXPECT_EQ(after.pageable_async_copies, before.pageable_async_copies);
}

TEST_F(CopiesTest, SyncCopyWaitsForWorkOnBlockingStreams) {
  // The sync copy goes through the legacy default stream: it starts after the blocking
  // stream's memset, so it reads what the memset wrote.
  ASSERT_EQ(tide_standin_set_bandwidth(0, 0.01), 0);  // the first download: 100 ms
  constexpr std::size_t kBytes = 1 << 20;
  DeviceBuffer buffer(kBytes);
  PinnedVector staging(kBytes);
  Stream blocking(CU_STREAM_DEFAULT);
  ASSERT_EQ(cuMemcpyDtoHAsync(staging.data(), buffer.get(), kBytes, blocking.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD8Async(buffer.get(), 0x77, kBytes, blocking.get()), CUDA_SUCCESS);
  ASSERT_EQ(tide_standin_set_bandwidth(0, 0), 0);
  std::vector<std::uint8_t> out(kBytes, 0);
  ASSERT_EQ(cuMemcpyDtoH(out.data(), buffer.get(), kBytes), CUDA_SUCCESS);
  EXPECT_EQ(out, std::vector<std::uint8_t>(kBytes, 0x77));
}

TEST_F(CopiesTest, MemsetFillsBytes) {
  DeviceBuffer buffer(1000);
  ASSERT_EQ(cuMemsetD8Async(buffer.get(), 0xab, 1000, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD8Async(buffer.get() + 10, 0x01, 5, nullptr), CUDA_SUCCESS);
  std::vector<std::uint8_t> out(1000);
  ASSERT_EQ(cuMemcpyDtoH(out.data(), buffer.get(), out.size()), CUDA_SUCCESS);
  std::vector<std::uint8_t> expected(1000, 0xab);
  std::fill(expected.begin() + 10, expected.begin() + 15, 0x01);
  EXPECT_EQ(out, expected);
  EXPECT_EQ(cuMemsetD8Async(buffer.get() + 999, 0, 2, nullptr), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(CopiesTest, DeviceRangesAreChecked) {
  DeviceBuffer buffer(4096);
  std::vector<std::uint8_t> host(8192);
  EXPECT_EQ(cuMemcpyHtoD(buffer.get(), host.data(), 4097), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyHtoD(buffer.get() + 1, host.data(), 4096), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyDtoH(host.data(), buffer.get() + 4096, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(host.data()), host.data(), 16),
            CUDA_ERROR_INVALID_VALUE);  // host memory is no device pointer
  EXPECT_EQ(cuMemcpyHtoD(buffer.get(), nullptr, 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyDtoHAsync(nullptr, buffer.get(), 16, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyDtoDAsync(buffer.get(), 0, 16, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyHtoD(buffer.get(), host.data(), 0), CUDA_SUCCESS);  // nothing to do
  EXPECT_EQ(cuMemcpyHtoDAsync(buffer.get(), host.data(), 16, reinterpret_cast<CUstream>(&host)),
            CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(CopiesTest, HmmModeLetsDevicesAddressHostMemory) {
  // Off (a discrete GPU): a pageable host pointer is not device memory.
  std::vector<float> host(256, 1.5f);
  std::vector<float> out(256, 0.0f);
  const auto host_ptr = reinterpret_cast<CUdeviceptr>(host.data());
  constexpr std::size_t kBytes = 256 * sizeof(float);
  EXPECT_EQ(cuMemcpyDtoH(out.data(), host_ptr, kBytes), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(tide_standin_set_hmm(2), CUDA_ERROR_INVALID_VALUE);

  ASSERT_EQ(tide_standin_set_hmm(1), 0);
  EXPECT_EQ(cuMemcpyDtoH(out.data(), host_ptr, kBytes), CUDA_SUCCESS);
  EXPECT_EQ(out, host);
  ASSERT_EQ(cuMemsetD8Async(host_ptr, 0, kBytes, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(host, std::vector<float>(256, 0.0f));
  // Still refused: running off the end of a device allocation, and reserved address space.
  DeviceBuffer device(kBytes);
  EXPECT_EQ(cuMemcpyDtoH(out.data(), device.get() + 8, kBytes), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr reserved = 0;
  std::size_t granularity = 0;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  ASSERT_EQ(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_SUCCESS);
  ASSERT_EQ(cuMemAddressReserve(&reserved, granularity, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyDtoH(out.data(), reserved + 64, kBytes), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAddressFree(reserved, granularity), CUDA_SUCCESS);

  ASSERT_EQ(tide_standin_set_hmm(0), 0);
  EXPECT_EQ(cuMemcpyDtoH(out.data(), host_ptr, kBytes), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(CopiesTest, SimulatedBandwidthSetsCopyTimes) {
  constexpr std::size_t kBytes = 1 << 20;
  ASSERT_EQ(tide_standin_set_bandwidth(0.01, 0.02), 0);  // 105 ms up, 52 ms down
  PinnedVector host(kBytes, 1);
  DeviceBuffer buffer(kBytes);
  auto start = Clock::now();
  ASSERT_EQ(cuMemcpyHtoD(buffer.get(), host.data(), kBytes), CUDA_SUCCESS);
  const double up = seconds_since(start);
  start = Clock::now();
  ASSERT_EQ(cuMemcpyDtoH(host.data(), buffer.get(), kBytes), CUDA_SUCCESS);
  const double down = seconds_since(start);
  EXPECT_GE(up, kBytes / 0.01e9 * 0.95);
  EXPECT_LT(up, 1.0);
  EXPECT_GE(down, kBytes / 0.02e9 * 0.95);
  EXPECT_LT(down, up);
  // Device-to-device copies have no simulated limit.
  DeviceBuffer other(kBytes);
  start = Clock::now();
  ASSERT_EQ(cuMemcpyDtoDAsync(other.get(), buffer.get(), kBytes, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(nullptr), CUDA_SUCCESS);
  EXPECT_LT(seconds_since(start), kBytes / 0.01e9);
  EXPECT_EQ(tide_standin_set_bandwidth(-1, 0), CUDA_ERROR_INVALID_VALUE);
}

}  // namespace
}  // namespace tide::standin::test
