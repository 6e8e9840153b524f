// Blocks: the pieces of device memory the caching allocator hands out and keeps.
//
// A segment is one address range from the driver (a cuMemAlloc'd buffer, or a growable range
// reserved with cuMemAddressReserve and backed piece by piece); it is tiled by blocks, linked in
// address order so that a freed block can merge with free neighbours in O(1).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tide::allocator::device {

// Requests are rounded up to this, and every block starts at a multiple of it.
inline constexpr std::size_t kMinBlockSize = 512;
// Requests up to this size come from the small pool (2 MiB segments); larger ones from the large
// pool, so that short-lived small tensors do not fragment the memory of large ones.
inline constexpr std::size_t kSmallSize = std::size_t{1} << 20;
inline constexpr std::size_t kSmallSegmentSize = std::size_t{2} << 20;

// The free-block tag of memory no stream's work can still touch: reusable on any stream.
inline const CUstream kAnyStream = reinterpret_cast<CUstream>(~std::uintptr_t{0});

enum class BlockState : std::uint8_t {
  kAllocated,  // handed out
  kFree,       // cached, in its pool's index
  kPending,    // freed, but other streams (record_stream) may still use it: waits for events
  kUnmapped,   // a growable segment's address range with no physical memory behind it
};

enum class PoolKind : std::uint8_t { kSmall = 0, kLarge = 1 };

struct Segment;

struct Block {
  CUdeviceptr ptr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;  // what the caller asked for (allocated blocks)
  // Allocated: the stream it was allocated on. Free: the stream whose work may still use it, or
  // kAnyStream once an event has shown that work to be done.
  CUstream stream = nullptr;
  BlockState state = BlockState::kFree;
  PoolKind pool = PoolKind::kLarge;
  Segment* segment = nullptr;
  Block* prev = nullptr;  // address neighbours within the segment
  Block* next = nullptr;
  // Free blocks tagged with a stream: that stream's fence epoch when the block was freed; an
  // event recorded at epoch e covers every block freed at an epoch <= e.
  std::uint64_t free_epoch = 0;
  // record_stream: other streams that used the block while it was allocated.
  std::vector<CUstream> uses;
  std::uint64_t trace_id = 0;  // allocation-event trace: the block's id while it is traced
  bool from_headroom = false;  // allocated: by allocate_from_headroom (caching_allocator.h)

  bool is_free() const { return state == BlockState::kFree; }
};

}  // namespace tide::allocator::device
