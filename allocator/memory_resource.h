// The interface of tide's device memory resources, in the spirit of RMM's: stream-ordered
// allocate/deallocate, so that resources compose (an adaptor wraps another resource) and callers
// (the C ABI, the replayer, the scheduler) depend on the interface only.
#pragma once

#include <cuda.h>

#include <cstddef>

namespace tide::allocator {

class DeviceMemoryResource {
 public:
  virtual ~DeviceMemoryResource() = default;
  // `bytes` of device memory, usable by work on `stream` in stream order. Null when the device
  // (or the resource's limit) is out of memory; other driver failures throw driver::CudaError.
  virtual void* allocate(std::size_t bytes, CUstream stream) = 0;
  // Gives back memory from allocate(), with the `bytes` and `stream` it was allocated with
  // (bytes 0: unknown, looked up).
  virtual void deallocate(void* ptr, std::size_t bytes, CUstream stream) = 0;
};

// cuMemAlloc / cuMemFree on every call: no caching. The baseline the caching allocator is
// measured against. The device's context must be current.
class DriverResource final : public DeviceMemoryResource {
 public:
  void* allocate(std::size_t bytes, CUstream stream) override;
  void deallocate(void* ptr, std::size_t bytes, CUstream stream) override;
};

}  // namespace tide::allocator
