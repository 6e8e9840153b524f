// A growable segment's memory: one address range reserved once (cuMemAddressReserve), backed
// page by page with physical memory (cuMemCreate + cuMemMap) as the workload grows, and unbacked
// page by page when the cache is released. Blocks never move, and a workload that grows does
// not end up spread over many segments whose free ends cannot be merged.
#pragma once

#include <cuda.h>

#include <cstddef>
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

  // Backs [offset, offset + bytes) (page multiples, all unbacked) with physical memory: one
  // driver allocation per page, so that any page can be given back later. On failure (e.g.
  // CUDA_ERROR_OUT_OF_MEMORY) the pages it backed are given back and the CudaError propagates.
  // Returns the number of pages backed.
  std::size_t map(std::size_t offset, std::size_t bytes);
  // Gives back the pages of [offset, offset + bytes) (page multiples, all backed). Returns the
  // number of pages.
  std::size_t unmap(std::size_t offset, std::size_t bytes);
  bool page_mapped(std::size_t page) const { return pages_[page].get() != 0; }

 private:
  int device_;
  std::size_t page_;
  driver::AddressRange range_;
  std::vector<driver::PhysicalMemory> pages_;
  std::size_t mapped_pages_ = 0;
};

}  // namespace tide::allocator::device
