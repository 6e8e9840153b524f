#include "allocator/device/device_registry.h"

#include <array>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>

#include "driver/context.h"

namespace tide::allocator::device {
namespace {

struct Registry {
  std::mutex create;
  std::array<std::atomic<CachingAllocator*>, kMaxDevices> allocators{};
};

Registry& registry() {
  static auto* r = new Registry;  // never destroyed (see the header)
  return *r;
}

}  // namespace

CachingAllocator* find_device_allocator(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return registry().allocators[device].load(std::memory_order_acquire);
}

CachingAllocator& device_allocator(int device) {
  if (CachingAllocator* a = find_device_allocator(device)) return *a;
  if (device < 0 || device >= kMaxDevices || device >= driver::device_count()) {
    throw std::invalid_argument("tide allocator: no device " + std::to_string(device));
  }
  Registry& r = registry();
  const std::lock_guard lock(r.create);
  CachingAllocator* a = r.allocators[device].load(std::memory_order_acquire);
  if (a == nullptr) {
    a = new CachingAllocator(device);
    r.allocators[device].store(a, std::memory_order_release);
  }
  return *a;
}

void for_each_device_allocator(const std::function<void(CachingAllocator&)>& fn) {
  for (int d = 0; d < kMaxDevices; ++d) {
    if (CachingAllocator* a = find_device_allocator(d)) fn(*a);
  }
}

}  // namespace tide::allocator::device
