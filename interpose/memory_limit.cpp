#include "interpose/memory_limit.h"

#include <algorithm>

namespace tide::interpose {

std::atomic<std::uint64_t>* MemoryLimit::slot(int device) {
  return device >= 0 && device < kMaxDevices ? &used_[device] : nullptr;
}

const std::atomic<std::uint64_t>* MemoryLimit::slot(int device) const {
  return device >= 0 && device < kMaxDevices ? &used_[device] : nullptr;
}

bool MemoryLimit::reserve(int device, std::uint64_t bytes) {
  if (!enabled()) return true;
  auto* used = slot(device);
  if (used == nullptr) return true;
  std::uint64_t current = used->load(std::memory_order_relaxed);
  do {
    if (bytes > limit_ || current > limit_ - bytes) return false;
  } while (!used->compare_exchange_weak(current, current + bytes, std::memory_order_relaxed));
  return true;
}

void MemoryLimit::release(int device, std::uint64_t bytes) {
  if (!enabled()) return;
  auto* used = slot(device);
  if (used == nullptr) return;
  std::uint64_t current = used->load(std::memory_order_relaxed);
  while (!used->compare_exchange_weak(current, current - std::min(current, bytes),
                                      std::memory_order_relaxed)) {
  }
}

void MemoryLimit::add(int device, std::uint64_t bytes) {
  if (!enabled()) return;
  if (auto* used = slot(device)) used->fetch_add(bytes, std::memory_order_relaxed);
}

std::uint64_t MemoryLimit::used(int device) const {
  const auto* used = slot(device);
  return used != nullptr ? used->load(std::memory_order_relaxed) : 0;
}

std::uint64_t MemoryLimit::limited_total(std::uint64_t total) const {
  return enabled() ? std::min(total, limit_) : total;
}

std::uint64_t MemoryLimit::limited_free(int device, std::uint64_t free) const {
  if (!enabled()) return free;
  const std::uint64_t in_use = used(device);
  return std::min(free, in_use < limit_ ? limit_ - in_use : 0);
}

void MemoryLimit::reset() {
  for (auto& used : used_) used.store(0, std::memory_order_relaxed);
}

}  // namespace tide::interpose
