// A growable segment's memory: one address range reserved once (cuMemAddressReserve), backed
// with physical memory (cuMemCreate + cuMemMap) as the workload grows, and unbacked when the
// cache is released. Blocks never move, and a workload that grows does not end up spread over
// many segments whose free ends cannot be merged.
//
// Backing is in pieces: one driver allocation, mapped once, of one or more 2 MiB pages (the
// allocation granularity). The driver gives a piece back only whole (cuMemUnmap cannot unmap part
// of a mapping, cuMemMap maps a handle from offset 0), so the piece is the unit of both growing
// and giving back: the allocator chooses piece sizes (caching_allocator_growth.cpp) between few
// driver calls (large pieces) and fine-grained release (one page per piece).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "driver/virtual_memory.h"

namespace tide::allocator::device {

class GrowableRange {
 public:
  // Reserves `bytes` (rounded up to the allocation granularity) of addresses on `device`.
  GrowableRange(std::size_t bytes, int device);
  ~GrowableRange();
  GrowableRange(const GrowableRange&) = delete;
  GrowableRange& operator=(const GrowableRange&) = delete;

  CUdeviceptr base() const { return range_.get(); }
  std::size_t size() const { return range_.size(); }
  std::size_t page_size() const { return page_; }
  std::size_t mapped_bytes() const { return mapped_pages_ * page_; }

  // Backs [offset, offset + bytes) (page multiples, all unbacked) with physical memory, in pieces
  // of at most `max_piece` bytes (at least one page) from `offset` on. On failure (e.g.
  // CUDA_ERROR_OUT_OF_MEMORY) the pieces it backed are given back and the CudaError propagates.
  // Returns the number of pieces (driver allocations and mappings).
  std::size_t map(std::size_t offset, std::size_t bytes, std::size_t max_piece);
  // Gives back the pieces of [offset, offset + bytes), which must be whole backed pieces (see
  // whole_pieces). Returns the number of pieces.
  std::size_t unmap(std::size_t offset, std::size_t bytes);
  // The part of [offset, offset + bytes) (page multiples, all backed) that whole pieces cover:
  // {start, length}, length 0 if no piece lies wholly inside.
  std::pair<std::size_t, std::size_t> whole_pieces(std::size_t offset, std::size_t bytes) const;
  bool page_mapped(std::size_t page) const { return head_[page] != kUnmapped; }
  // Pages of the piece that backs `page` (0 if unbacked).
  std::size_t piece_pages(std::size_t page) const;

 private:
  static constexpr std::size_t kUnmapped = static_cast<std::size_t>(-1);

  int device_;
  std::size_t page_;
  driver::AddressRange range_;
  // Per page: the first page of the piece that backs it (kUnmapped: none); the piece's physical
  // memory is held at its first page.
  std::vector<std::size_t> head_;
  std::vector<driver::PhysicalMemory> pieces_;
  std::size_t mapped_pages_ = 0;
};

}  // namespace tide::allocator::device
