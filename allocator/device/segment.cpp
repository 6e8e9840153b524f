#include "allocator/device/segment.h"

#include "driver/cuda_api.h"
#include "driver/error.h"

namespace tide::allocator::device {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kMidSizeLimit = 10 * kMiB;
constexpr std::size_t kMidSegmentSize = 20 * kMiB;
constexpr std::size_t kLargeRounding = 2 * kMiB;

}  // namespace

std::size_t fixed_segment_size(std::size_t rounded, PoolKind pool) {
  if (pool == PoolKind::kSmall) return kSmallSegmentSize;
  if (rounded < kMidSizeLimit) return kMidSegmentSize;
  return (rounded + kLargeRounding - 1) / kLargeRounding * kLargeRounding;
}

CUdeviceptr allocate_fixed(std::size_t bytes) {
  CUdeviceptr ptr = 0;
  TIDE_CU(cuMemAlloc, &ptr, bytes);
  return ptr;
}

void free_fixed(CUdeviceptr ptr) { TIDE_CU(cuMemFree, ptr); }

}  // namespace tide::allocator::device
