// Segments: the address ranges the caching allocator gets from the driver and carves into
// blocks. A fixed segment is one cuMemAlloc'd buffer; a growable one is a reserved address range
// backed piece by piece (growable_segment.h).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <memory>

#include "allocator/device/block.h"
#include "allocator/device/growable_segment.h"

namespace tide::allocator::device {

struct Segment {
  CUdeviceptr base = 0;
  std::size_t size = 0;  // the address range (growable: all of the reservation)
  PoolKind pool = PoolKind::kLarge;
  Block* first = nullptr;             // lowest-address block
  std::unique_ptr<GrowableRange> vm;  // growable segments only
  bool growable() const { return vm != nullptr; }
  // Bytes backed by physical memory: what the segment reserves on the device.
  std::size_t reserved() const { return vm ? vm->mapped_bytes() : size; }
};

// The size of a new fixed segment for a block of `rounded` bytes: small requests share 2 MiB
// segments; large ones below 10 MiB share 20 MiB segments (so that a few such segments serve
// many mid-sized tensors); larger ones get a segment of their own, rounded up to 2 MiB.
std::size_t fixed_segment_size(std::size_t rounded, PoolKind pool);

// cuMemAlloc / cuMemFree of a fixed segment's memory (the device's context must be current).
CUdeviceptr allocate_fixed(std::size_t bytes);
void free_fixed(CUdeviceptr ptr);

}  // namespace tide::allocator::device
