// The caching allocator's memory taken out of the headroom, as a DeviceMemoryResource: where the
// executor's update-phase buffers come from when tide's allocator serves the device. They are
// carved from its cache (memory the forward and backward passes freed, which the driver does not
// see as free), and the telemetry keeps them out of the peaks the headroom is forecast from.
#pragma once

#include "allocator/device/caching_allocator.h"
#include "allocator/memory_resource.h"

namespace tide::allocator::device {

class HeadroomResource final : public DeviceMemoryResource {
 public:
  explicit HeadroomResource(CachingAllocator& allocator) : allocator_(allocator) {}
  void* allocate(std::size_t bytes, CUstream stream) override {
    return allocator_.allocate_from_headroom(bytes, stream);
  }
  void deallocate(void* ptr, std::size_t bytes, CUstream stream) override {
    allocator_.deallocate_from_headroom(ptr, bytes, stream);
  }
  CachingAllocator& allocator() const { return allocator_; }

 private:
  CachingAllocator& allocator_;
};

}  // namespace tide::allocator::device
