// Host memory for pinned chunks, from the kernel: mapping, NUMA binding, transparent huge pages and
// touching every page before the driver registers it. Nothing here talks to the driver.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tide::allocator::pinned {

// jemalloc's page (its extents are multiples of it) and the granule of the chunk pool.
inline constexpr std::size_t kPage = 4096;
// Chunks start at a huge-page boundary so that transparent huge pages can back them.
inline constexpr std::size_t kHugePage = std::size_t{2} << 20;

constexpr std::size_t round_up(std::size_t n, std::size_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

struct ChunkPlacement {
  int numa_node = -1;  // -1: no binding
  bool huge_pages = true;
  int touch_threads = 1;
};

// Maps `bytes` (a multiple of kPage) of private anonymous memory at a kHugePage boundary, binds it
// to the NUMA node, asks for huge pages and writes every page (in parallel for large chunks), so
// that registering it does not fault pages in one by one under the driver's lock. Adds the time
// spent touching to *touch_ns. Throws std::bad_alloc when the kernel has no memory to give.
void* map_chunk(std::size_t bytes, const ChunkPlacement& placement, std::uint64_t* touch_ns);

void unmap_chunk(void* base, std::size_t bytes) noexcept;

// Throws std::invalid_argument if the machine has no NUMA node `node`. Where the kernel does not
// say which nodes exist, says so once (stderr) and returns false: chunks are then not bound.
bool check_numa_node(int node);

// The NUMA node the page holding `p` is on (get_mempolicy), or -1 if the kernel does not say.
int numa_node_of(const void* p);

// touch_threads from the options (0: the default) as the number of threads to use.
int resolve_touch_threads(int requested);

}  // namespace tide::allocator::pinned
