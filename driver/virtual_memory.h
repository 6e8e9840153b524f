// The driver's virtual-memory calls: reserve an address range once, then back it piece by piece
// with physical memory. The allocator grows segments this way without moving them.
#pragma once

#include <cuda.h>

#include <cstddef>

namespace tide::driver {

// Whether the loaded driver has the virtual-memory calls.
bool has_virtual_memory();

// cuMemGetAllocationGranularity (minimum) for pinned device memory on `device`: sizes and
// offsets of physical pieces and mappings must be multiples of it.
std::size_t allocation_granularity(int device);

class AddressRange {
 public:
  AddressRange() = default;
  explicit AddressRange(std::size_t bytes, std::size_t alignment = 0);
  ~AddressRange();
  AddressRange(AddressRange&& other) noexcept;
  AddressRange& operator=(AddressRange&& other) noexcept;
  AddressRange(const AddressRange&) = delete;
  AddressRange& operator=(const AddressRange&) = delete;

  CUdeviceptr get() const { return base_; }
  std::size_t size() const { return bytes_; }

 private:
  CUdeviceptr base_ = 0;
  std::size_t bytes_ = 0;
};

class PhysicalMemory {
 public:
  PhysicalMemory() = default;
  PhysicalMemory(std::size_t bytes, int device);
  ~PhysicalMemory();
  PhysicalMemory(PhysicalMemory&& other) noexcept;
  PhysicalMemory& operator=(PhysicalMemory&& other) noexcept;
  PhysicalMemory(const PhysicalMemory&) = delete;
  PhysicalMemory& operator=(const PhysicalMemory&) = delete;

  CUmemGenericAllocationHandle get() const { return handle_; }
  std::size_t size() const { return bytes_; }

 private:
  CUmemGenericAllocationHandle handle_ = 0;
  std::size_t bytes_ = 0;
};

// Maps all of `memory` at `address` and makes it readable and writable from `device`.
void map(CUdeviceptr address, const PhysicalMemory& memory, int device);
void unmap(CUdeviceptr address, std::size_t bytes);

}  // namespace tide::driver
