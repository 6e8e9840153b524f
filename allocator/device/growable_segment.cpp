#include "allocator/device/growable_segment.h"

#include <exception>
#include <utility>

namespace tide::allocator::device {
namespace {

std::size_t round_up(std::size_t n, std::size_t m) { return (n + m - 1) / m * m; }

}  // namespace

GrowableRange::GrowableRange(std::size_t bytes, int device)
    : device_(device),
      page_(driver::allocation_granularity(device)),
      range_(round_up(bytes, page_), page_),
      pages_(range_.size() / page_) {}

GrowableRange::~GrowableRange() {
  // Unmap before the physical memory is released and the range freed (members' destructors).
  for (std::size_t i = 0; i < pages_.size(); ++i) {
    if (pages_[i].get() != 0) {
      try {
        driver::unmap(base() + i * page_, page_);
      } catch (const std::exception&) {
        // Nothing more to do at destruction: the range is freed below regardless.
      }
    }
  }
}

std::size_t GrowableRange::map(std::size_t offset, std::size_t bytes) {
  const std::size_t first = offset / page_;
  const std::size_t count = bytes / page_;
  std::size_t done = 0;
  try {
    for (; done < count; ++done) {
      const std::size_t i = first + done;
      driver::PhysicalMemory memory(page_, device_);
      driver::map(base() + i * page_, memory, device_);
      pages_[i] = std::move(memory);
      ++mapped_pages_;
    }
  } catch (...) {
    // Leave nothing half-grown: the caller sees the range as it was.
    if (done > 0) unmap(offset, done * page_);
    throw;
  }
  return count;
}

std::size_t GrowableRange::unmap(std::size_t offset, std::size_t bytes) {
  const std::size_t first = offset / page_;
  const std::size_t count = bytes / page_;
  for (std::size_t i = first; i < first + count; ++i) {
    driver::unmap(base() + i * page_, page_);
    pages_[i] = driver::PhysicalMemory{};
  }
  mapped_pages_ -= count;
  return count;
}

}  // namespace tide::allocator::device
