// The process's caching allocators, one per device, as the C ABI (and through it PyTorch) uses
// them. Each is created on first use with the TIDE_* configuration and is never destroyed: blocks
// may be freed from any thread until the process ends, and tearing down at exit would race with
// the driver's own teardown.
#pragma once

#include <functional>

#include "allocator/device/caching_allocator.h"

namespace tide::allocator::device {

inline constexpr int kMaxDevices = 64;

// Throws std::invalid_argument for a device that does not exist.
CachingAllocator& device_allocator(int device);
// Null until device_allocator(device) has created it.
CachingAllocator* find_device_allocator(int device);
// Every allocator created so far.
void for_each_device_allocator(const std::function<void(CachingAllocator&)>& fn);

}  // namespace tide::allocator::device
