#include "runtime/buffer_pool.h"

#include "allocator/device/device_registry.h"
#include "allocator/pinned/arena.h"

namespace tide::runtime {

BufferPool::BufferPool(int device, allocator::DeviceMemoryResource* memory)
    : given_(memory), device_(device) {}

allocator::DeviceMemoryResource& BufferPool::memory() {
  if (given_ != nullptr) return *given_;
  if (headroom_memory_ == nullptr) {
    if (allocator::device::CachingAllocator* a =
            allocator::device::find_device_allocator(device_)) {
      headroom_memory_ = std::make_unique<allocator::device::HeadroomResource>(*a);
    }
  }
  if (headroom_memory_ != nullptr) return *headroom_memory_;
  return driver_memory_;
}

allocator::device::CachingAllocator* BufferPool::caching_allocator() {
  allocator::DeviceMemoryResource& m = memory();
  auto* headroom = dynamic_cast<allocator::device::HeadroomResource*>(&m);
  return headroom != nullptr ? &headroom->allocator() : nullptr;
}

std::vector<UpdateBuffer> BufferPool::take(std::uint64_t bytes, std::size_t count) {
  std::vector<UpdateBuffer> taken;
  for (auto it = kept_.begin(); it != kept_.end() && taken.size() < count;) {
    if (it->size() >= bytes) {
      taken.push_back(std::move(*it));
      it = kept_.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

UpdateBuffer BufferPool::take_counters(std::uint64_t bytes) {
  UpdateBuffer counters = std::move(counters_);
  counters_ = UpdateBuffer();
  if (counters.size() < bytes) counters = UpdateBuffer();
  return counters;
}

void BufferPool::keep(std::vector<UpdateBuffer> used, UpdateBuffer counters,
                      std::uint64_t headroom) {
  std::uint64_t bytes = 0;
  for (const UpdateBuffer& b : used) bytes += b.size();
  for (UpdateBuffer& b : kept_) {
    if (bytes + b.size() > headroom) continue;  // freed below
    bytes += b.size();
    used.push_back(std::move(b));
  }
  kept_ = std::move(used);
  if (counters.get() != 0) counters_ = std::move(counters);
}

void BufferPool::clear() {
  kept_.clear();
  counters_ = UpdateBuffer();
}

std::uint64_t BufferPool::holdable(std::uint64_t headroom) {
  memory();  // finds tide's allocator if the process uses it
  if (given_ != nullptr || headroom_memory_ == nullptr) return headroom;
  const allocator::telemetry::HeadroomForecast f = headroom_memory_->allocator().headroom();
  return f.iterations > 0 ? std::min(headroom, f.held_headroom) : headroom;
}

std::uint64_t BufferPool::residency_budget(std::uint64_t headroom) {
  memory();
  if (given_ != nullptr) return headroom;
  if (headroom_memory_ == nullptr) return 0;
  const allocator::telemetry::HeadroomForecast f = headroom_memory_->allocator().headroom();
  return f.iterations > 0 ? std::min(headroom, f.held_headroom) : 0;
}

std::optional<std::uint64_t> BufferPool::update_headroom() {
  allocator::device::CachingAllocator* a = caching_allocator();
  if (a == nullptr) return std::nullopt;
  const allocator::telemetry::HeadroomForecast f = a->headroom();
  if (f.iterations == 0) return std::nullopt;
  return f.headroom;
}

CUdeviceptr BufferPool::add_gradient(std::uint64_t bytes, CUstream stream) {
  gradients_.emplace_back(memory(), bytes, stream);
  return gradients_.back().get();
}

std::uint64_t BufferPool::free_gradient(CUdeviceptr ptr) {
  const auto it = std::find_if(gradients_.begin(), gradients_.end(),
                               [ptr](const UpdateBuffer& b) { return b.get() == ptr; });
  if (it == gradients_.end()) return 0;
  const std::uint64_t bytes = it->size();
  gradients_.erase(it);
  return bytes;
}

std::uint64_t BufferPool::gradient_bytes() const {
  std::uint64_t bytes = 0;
  for (const UpdateBuffer& b : gradients_) bytes += b.size();
  return bytes;
}

void BufferPool::quarantine(std::vector<UpdateBuffer> buffers, UpdateBuffer counters) {
  unconfirmed_ = true;
  for (auto* list : {&buffers, &kept_, &gradients_}) {
    for (UpdateBuffer& b : *list) quarantined_.push_back(std::move(b));
    list->clear();
  }
  quarantined_.push_back(std::move(counters));
}

void BufferPool::release_quarantine(OptimizerState& state) {
  unconfirmed_ = false;
  quarantined_.clear();
  for (const auto& [subgroup, slot] : slots_) state.give_spare(subgroup, slot);
  slots_.clear();
  for (const auto& [p, bytes] : pinned_) state.arena().deallocate(p, bytes);
  pinned_.clear();
}

void BufferPool::leak() noexcept {
  for (auto* list : {&kept_, &gradients_, &quarantined_}) {
    for (UpdateBuffer& b : *list) b.leak();
  }
  counters_.leak();
}

}  // namespace tide::runtime
