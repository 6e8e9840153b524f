// Virtual memory management with CUDA's rules.
#include <cstring>
#include <numeric>
#include <vector>

#include "tests/standin/standin_test.h"

namespace tide::standin::test {
namespace {

constexpr std::size_t kGranularity = std::size_t{2} << 20;

class VirtualMemoryTest : public StandinTest {
 protected:
  void TearDown() override {
    tide_standin_set_capacity(0, std::uint64_t{8} << 30);
    StandinTest::TearDown();
  }

  static CUmemAllocationProp properties(int device = 0) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
  }

  static CUmemAccessDesc read_write(int device = 0) {
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return access;
  }

  static CUmemGenericAllocationHandle create(std::size_t bytes) {
    const CUmemAllocationProp prop = properties();
    CUmemGenericAllocationHandle handle = 0;
    EXPECT_EQ(cuMemCreate(&handle, bytes, &prop, 0), CUDA_SUCCESS);
    return handle;
  }

  static CUdeviceptr reserve(std::size_t bytes, std::size_t alignment = 0) {
    CUdeviceptr base = 0;
    EXPECT_EQ(cuMemAddressReserve(&base, bytes, alignment, 0, 0), CUDA_SUCCESS);
    return base;
  }

  static void map_rw(CUdeviceptr at, std::size_t bytes, CUmemGenericAllocationHandle handle) {
    ASSERT_EQ(cuMemMap(at, bytes, 0, handle, 0), CUDA_SUCCESS);
    const CUmemAccessDesc access = read_write();
    ASSERT_EQ(cuMemSetAccess(at, bytes, &access, 1), CUDA_SUCCESS);
  }

  static std::size_t free_memory() {
    std::size_t free_bytes = 0;
    std::size_t total = 0;
    EXPECT_EQ(cuMemGetInfo(&free_bytes, &total), CUDA_SUCCESS);
    return free_bytes;
  }
};

TEST_F(VirtualMemoryTest, GranularityIsTwoMebibytes) {
  const CUmemAllocationProp prop = properties();
  std::size_t granularity = 0;
  ASSERT_EQ(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_SUCCESS);
  EXPECT_EQ(granularity, kGranularity);
  ASSERT_EQ(
      cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
      CUDA_SUCCESS);
  EXPECT_EQ(granularity, kGranularity);
  CUmemAllocationProp host = prop;
  host.location.type = CU_MEM_LOCATION_TYPE_HOST;
  EXPECT_EQ(cuMemGetAllocationGranularity(&granularity, &host, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_ERROR_INVALID_VALUE);
  const CUmemAllocationProp other = properties(5);
  EXPECT_EQ(cuMemGetAllocationGranularity(&granularity, &other, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cuMemGetAllocationGranularity(&granularity, nullptr, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(VirtualMemoryTest, ReservationsFollowTheGranularityRules) {
  CUdeviceptr base = 0;
  EXPECT_EQ(cuMemAddressReserve(&base, kGranularity + 4096, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAddressReserve(&base, 0, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAddressReserve(&base, kGranularity, 4096, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAddressReserve(&base, kGranularity, 3 * kGranularity, 0, 0),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAddressReserve(&base, kGranularity, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);

  ASSERT_EQ(cuMemAddressReserve(&base, 4 * kGranularity, 16 * kGranularity, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(base % (16 * kGranularity), 0u);
  EXPECT_EQ(cuMemAddressFree(base, 2 * kGranularity), CUDA_ERROR_INVALID_VALUE);  // wrong size
  EXPECT_EQ(cuMemAddressFree(base, 4 * kGranularity), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAddressFree(base, 4 * kGranularity), CUDA_ERROR_INVALID_VALUE);  // twice
}

TEST_F(VirtualMemoryTest, PhysicalMemoryCountsAgainstCapacity) {
  const std::size_t before = free_memory();
  const CUmemAllocationProp prop = properties();
  CUmemGenericAllocationHandle handle = 0;
  EXPECT_EQ(cuMemCreate(&handle, kGranularity + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemCreate(&handle, kGranularity, &prop, 1), CUDA_ERROR_INVALID_VALUE);
  const tide_standin_stats start = stats();
  ASSERT_EQ(cuMemCreate(&handle, 3 * kGranularity, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(free_memory(), before - 3 * kGranularity);
  EXPECT_EQ(stats().mem_creates - start.mem_creates, 1u);
  ASSERT_EQ(cuMemRelease(handle), CUDA_SUCCESS);  // never mapped: gone at once
  EXPECT_EQ(free_memory(), before);
  EXPECT_EQ(cuMemRelease(handle), CUDA_ERROR_INVALID_VALUE);

  ASSERT_EQ(tide_standin_set_capacity(0, 4 * kGranularity), 0);
  ASSERT_EQ(cuMemCreate(&handle, 4 * kGranularity, &prop, 0), CUDA_SUCCESS);
  CUmemGenericAllocationHandle more = 0;
  EXPECT_EQ(cuMemCreate(&more, kGranularity, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc(&p, 1), CUDA_ERROR_OUT_OF_MEMORY);  // one capacity for both kinds
  ASSERT_EQ(cuMemRelease(handle), CUDA_SUCCESS);
  ASSERT_EQ(cuMemCreate(&more, kGranularity, &prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemRelease(more), CUDA_SUCCESS);
}

TEST_F(VirtualMemoryTest, MapRejectsWhatCudaRejects) {
  const CUdeviceptr base = reserve(4 * kGranularity);
  const CUmemGenericAllocationHandle handle = create(2 * kGranularity);
  EXPECT_EQ(cuMemMap(base + 4096, 2 * kGranularity, 0, handle, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemMap(base, kGranularity + 4096, 0, handle, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemMap(base, 2 * kGranularity, kGranularity, handle, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemMap(base, 4 * kGranularity, 0, handle, 0), CUDA_ERROR_INVALID_VALUE);  // > handle
  EXPECT_EQ(cuMemMap(base + 3 * kGranularity, 2 * kGranularity, 0, handle, 0),
            CUDA_ERROR_INVALID_VALUE);  // past the reservation's end
  EXPECT_EQ(cuMemMap(base + 64 * kGranularity, 2 * kGranularity, 0, handle, 0),
            CUDA_ERROR_INVALID_VALUE);  // outside any reservation
  EXPECT_EQ(cuMemMap(base, 2 * kGranularity, 0, handle, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemMap(base, 2 * kGranularity, 0, handle + 1000, 0), CUDA_ERROR_INVALID_HANDLE);

  ASSERT_EQ(cuMemMap(base + kGranularity, 2 * kGranularity, 0, handle, 0), CUDA_SUCCESS);
  // Over a mapping, wholly or partly.
  EXPECT_EQ(cuMemMap(base + kGranularity, 2 * kGranularity, 0, handle, 0),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemMap(base, 2 * kGranularity, 0, handle, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemMap(base + 2 * kGranularity, 2 * kGranularity, 0, handle, 0),
            CUDA_ERROR_INVALID_VALUE);
  // The reservation cannot go while mapped; unmapping only whole mappings.
  EXPECT_EQ(cuMemAddressFree(base, 4 * kGranularity), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemUnmap(base + kGranularity, kGranularity), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemUnmap(base, 2 * kGranularity), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuMemUnmap(base + kGranularity, 2 * kGranularity), CUDA_SUCCESS);
  ASSERT_EQ(cuMemRelease(handle), CUDA_SUCCESS);
  // A released handle cannot be mapped.
  EXPECT_EQ(cuMemMap(base, 2 * kGranularity, 0, handle, 0), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuMemAddressFree(base, 4 * kGranularity), CUDA_SUCCESS);
}

TEST_F(VirtualMemoryTest, MappedMemoryIsInaccessibleUntilSetAccess) {
  const CUdeviceptr base = reserve(2 * kGranularity);
  const CUmemGenericAllocationHandle handle = create(2 * kGranularity);
  ASSERT_EQ(cuMemMap(base, 2 * kGranularity, 0, handle, 0), CUDA_SUCCESS);
  std::vector<std::uint8_t> host(4096, 9);
  EXPECT_EQ(cuMemcpyHtoD(base, host.data(), host.size()), CUDA_ERROR_INVALID_VALUE);
  const CUmemAccessDesc rw = read_write();
  EXPECT_EQ(cuMemSetAccess(base, kGranularity, &rw, 1), CUDA_ERROR_INVALID_VALUE);  // part
  EXPECT_EQ(cuMemSetAccess(base, 2 * kGranularity, nullptr, 1), CUDA_ERROR_INVALID_VALUE);
  CUmemAccessDesc read_only = rw;
  read_only.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  ASSERT_EQ(cuMemSetAccess(base, 2 * kGranularity, &read_only, 1), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyHtoD(base, host.data(), host.size()), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyDtoH(host.data(), base, host.size()), CUDA_SUCCESS);
  EXPECT_EQ(host, std::vector<std::uint8_t>(4096, 0));  // fresh memory reads as zeros
  ASSERT_EQ(cuMemSetAccess(base, 2 * kGranularity, &rw, 1), CUDA_SUCCESS);
  std::fill(host.begin(), host.end(), 9);
  EXPECT_EQ(cuMemcpyHtoD(base, host.data(), host.size()), CUDA_SUCCESS);
  ASSERT_EQ(cuMemUnmap(base, 2 * kGranularity), CUDA_SUCCESS);
  ASSERT_EQ(cuMemRelease(handle), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAddressFree(base, 2 * kGranularity), CUDA_SUCCESS);
}

TEST_F(VirtualMemoryTest, OnePhysicalPieceMappedTwiceShowsTheSameBytes) {
  const CUdeviceptr first = reserve(kGranularity);
  const CUdeviceptr second = reserve(kGranularity);
  const CUmemGenericAllocationHandle handle = create(kGranularity);
  map_rw(first, kGranularity, handle);
  map_rw(second, kGranularity, handle);
  std::vector<std::uint8_t> in(kGranularity);
  std::iota(in.begin(), in.end(), std::uint8_t{3});
  ASSERT_EQ(cuMemcpyHtoD(first, in.data(), in.size()), CUDA_SUCCESS);
  std::vector<std::uint8_t> out(kGranularity);
  ASSERT_EQ(cuMemcpyDtoH(out.data(), second, out.size()), CUDA_SUCCESS);
  EXPECT_EQ(in, out);
  // Host-backed: the mapping can be read directly as well.
  EXPECT_EQ(std::memcmp(reinterpret_cast<void*>(second), in.data(), in.size()), 0);
  ASSERT_EQ(cuMemUnmap(first, kGranularity), CUDA_SUCCESS);
  ASSERT_EQ(cuMemUnmap(second, kGranularity), CUDA_SUCCESS);
  ASSERT_EQ(cuMemRelease(handle), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAddressFree(first, kGranularity), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAddressFree(second, kGranularity), CUDA_SUCCESS);
}

TEST_F(VirtualMemoryTest, ReleasedWhileMappedLivesUntilUnmapped) {
  const std::size_t before = free_memory();
  const CUdeviceptr base = reserve(2 * kGranularity);
  const CUmemGenericAllocationHandle handle = create(2 * kGranularity);
  map_rw(base, 2 * kGranularity, handle);
  std::vector<std::uint8_t> in(2 * kGranularity, 0x42);
  ASSERT_EQ(cuMemcpyHtoD(base, in.data(), in.size()), CUDA_SUCCESS);
  const tide_standin_stats start = stats();
  ASSERT_EQ(cuMemRelease(handle), CUDA_SUCCESS);
  EXPECT_EQ(stats().mem_releases - start.mem_releases, 1u);
  EXPECT_EQ(free_memory(), before - 2 * kGranularity);  // still there
  std::vector<std::uint8_t> out(in.size());
  ASSERT_EQ(cuMemcpyDtoH(out.data(), base, out.size()), CUDA_SUCCESS);
  EXPECT_EQ(in, out);
  ASSERT_EQ(cuMemUnmap(base, 2 * kGranularity), CUDA_SUCCESS);
  EXPECT_EQ(free_memory(), before);  // gone with its last mapping
  // The range is a bare reservation again: mappable anew.
  const CUmemGenericAllocationHandle fresh = create(2 * kGranularity);
  map_rw(base, 2 * kGranularity, fresh);
  ASSERT_EQ(cuMemcpyDtoH(out.data(), base, out.size()), CUDA_SUCCESS);
  EXPECT_EQ(out, std::vector<std::uint8_t>(out.size(), 0));
  ASSERT_EQ(cuMemUnmap(base, 2 * kGranularity), CUDA_SUCCESS);
  ASSERT_EQ(cuMemRelease(fresh), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAddressFree(base, 2 * kGranularity), CUDA_SUCCESS);
}

TEST_F(VirtualMemoryTest, AdjacentMappingsFormOneDeviceRange) {
  const CUdeviceptr base = reserve(2 * kGranularity);
  const CUmemGenericAllocationHandle a = create(kGranularity);
  const CUmemGenericAllocationHandle b = create(kGranularity);
  map_rw(base, kGranularity, a);
  map_rw(base + kGranularity, kGranularity, b);
  // A copy and an unmap across both.
  std::vector<std::uint8_t> in(kGranularity, 5);
  ASSERT_EQ(cuMemcpyHtoD(base + kGranularity / 2, in.data(), in.size()), CUDA_SUCCESS);
  ASSERT_EQ(cuMemUnmap(base, 2 * kGranularity), CUDA_SUCCESS);
  ASSERT_EQ(cuMemRelease(a), CUDA_SUCCESS);
  ASSERT_EQ(cuMemRelease(b), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAddressFree(base, 2 * kGranularity), CUDA_SUCCESS);
}

}  // namespace
}  // namespace tide::standin::test
