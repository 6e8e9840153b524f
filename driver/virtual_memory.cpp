#include "driver/virtual_memory.h"

#include <utility>

#include "driver/cuda_api.h"
#include "driver/error.h"

namespace tide::driver {
namespace {

CUmemAllocationProp device_memory_properties(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

}  // namespace

bool has_virtual_memory() { return cuda().has_vmm(); }

std::size_t allocation_granularity(int device) {
  const CUmemAllocationProp prop = device_memory_properties(device);
  std::size_t granularity = 0;
  TIDE_CU(cuMemGetAllocationGranularity, &granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  return granularity;
}

AddressRange::AddressRange(std::size_t bytes, std::size_t alignment) : bytes_(bytes) {
  TIDE_CU(cuMemAddressReserve, &base_, bytes, alignment, 0, 0);
}

AddressRange::~AddressRange() {
  if (base_ != 0) cuda().cuMemAddressFree(base_, bytes_);
}

AddressRange::AddressRange(AddressRange&& other) noexcept
    : base_(std::exchange(other.base_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}

AddressRange& AddressRange::operator=(AddressRange&& other) noexcept {
  std::swap(base_, other.base_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

PhysicalMemory::PhysicalMemory(std::size_t bytes, int device) : bytes_(bytes) {
  const CUmemAllocationProp prop = device_memory_properties(device);
  TIDE_CU(cuMemCreate, &handle_, bytes, &prop, 0);
}

PhysicalMemory::~PhysicalMemory() {
  if (handle_ != 0) cuda().cuMemRelease(handle_);
}

PhysicalMemory::PhysicalMemory(PhysicalMemory&& other) noexcept
    : handle_(std::exchange(other.handle_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}

PhysicalMemory& PhysicalMemory::operator=(PhysicalMemory&& other) noexcept {
  std::swap(handle_, other.handle_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

void map(CUdeviceptr address, const PhysicalMemory& memory, int device) {
  TIDE_CU(cuMemMap, address, memory.size(), 0, memory.get(), 0);
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  TIDE_CU(cuMemSetAccess, address, memory.size(), &access, 1);
}

void unmap(CUdeviceptr address, std::size_t bytes) { TIDE_CU(cuMemUnmap, address, bytes); }

}  // namespace tide::driver
