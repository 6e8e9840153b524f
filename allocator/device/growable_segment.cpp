#include "allocator/device/growable_segment.h"

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <utility>

namespace tide::allocator::device {
namespace {

std::size_t round_up(std::size_t n, std::size_t m) { return (n + m - 1) / m * m; }

}  // namespace

GrowableRange::GrowableRange(std::size_t bytes, int device)
    : device_(device),
      page_(driver::allocation_granularity(device)),
      range_(round_up(bytes, page_), page_),
      head_(range_.size() / page_, kUnmapped),
      pieces_(range_.size() / page_) {}

GrowableRange::~GrowableRange() {
  // Unmap before the physical memory is released and the range freed (members' destructors).
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    if (pieces_[i].get() != 0) {
      try {
        driver::unmap(base() + i * page_, pieces_[i].size());
      } catch (const std::exception&) {
        // Nothing more to do at destruction: the range is freed below regardless.
      }
    }
  }
}

std::size_t GrowableRange::piece_pages(std::size_t page) const {
  return head_[page] == kUnmapped ? 0 : pieces_[head_[page]].size() / page_;
}

std::size_t GrowableRange::map(std::size_t offset, std::size_t bytes, std::size_t max_piece) {
  const std::size_t first = offset / page_;
  const std::size_t count = bytes / page_;
  const std::size_t per_piece = std::max<std::size_t>(1, max_piece / page_);
  std::size_t done = 0;
  std::size_t pieces = 0;
  try {
    while (done < count) {
      const std::size_t i = first + done;
      const std::size_t n = std::min(per_piece, count - done);
      driver::PhysicalMemory memory(n * page_, device_);
      driver::map(base() + i * page_, memory, device_);
      pieces_[i] = std::move(memory);
      std::fill_n(head_.begin() + static_cast<std::ptrdiff_t>(i), n, i);
      mapped_pages_ += n;
      done += n;
      ++pieces;
    }
  } catch (...) {
    // Leave nothing half-grown: the caller sees the range as it was.
    if (done > 0) unmap(offset, done * page_);
    throw;
  }
  return pieces;
}

std::size_t GrowableRange::unmap(std::size_t offset, std::size_t bytes) {
  const std::size_t first = offset / page_;
  const std::size_t end = first + bytes / page_;
  std::size_t pieces = 0;
  for (std::size_t i = first; i < end;) {
    if (head_[i] != i) throw std::logic_error("GrowableRange::unmap: not whole pieces");
    const std::size_t n = pieces_[i].size() / page_;
    if (i + n > end) throw std::logic_error("GrowableRange::unmap: not whole pieces");
    driver::unmap(base() + i * page_, n * page_);
    pieces_[i] = driver::PhysicalMemory{};
    std::fill_n(head_.begin() + static_cast<std::ptrdiff_t>(i), n, kUnmapped);
    mapped_pages_ -= n;
    i += n;
    ++pieces;
  }
  return pieces;
}

std::pair<std::size_t, std::size_t> GrowableRange::whole_pieces(std::size_t offset,
                                                                std::size_t bytes) const {
  std::size_t lo = offset / page_;
  std::size_t hi = (offset + bytes) / page_;
  if (lo >= hi) return {offset, 0};
  // Forward to the first piece that starts inside, back from the last piece that ends inside.
  if (head_[lo] != lo) lo = head_[lo] + pieces_[head_[lo]].size() / page_;
  if (lo < hi && head_[hi - 1] + pieces_[head_[hi - 1]].size() / page_ != hi) hi = head_[hi - 1];
  if (lo >= hi) return {offset, 0};
  return {lo * page_, (hi - lo) * page_};
}

}  // namespace tide::allocator::device
