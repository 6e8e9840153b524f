#include "allocator/pinned/memory.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace tide::allocator::pinned {
namespace {

// <numaif.h> belongs to libnuma's development package; the kernel ABI is all that is needed.
constexpr int kMpolBind = 2;
constexpr unsigned long kMpolFNode = 1;  // get_mempolicy: return the node...
constexpr unsigned long kMpolFAddr = 2;  // ...of the page at this address
constexpr int kMaxNodes = 1024;

// Below this, one thread touches faster than starting more.
constexpr std::size_t kTouchSlice = 64 << 20;

void say_once(std::once_flag& flag, const std::string& message) {
  std::call_once(flag, [&] { std::fprintf(stderr, "%s\n", message.c_str()); });
}

void touch_range(char* begin, char* end) {
  // A write, not a read: a read would map the shared zero page, which registering replaces.
  // With huge pages the first write of each 2 MiB faults all of it; the rest are cache hits.
  for (volatile char* p = begin; p < end; p += kPage) *p = 0;
}

void touch(char* base, std::size_t bytes, int threads) {
  const auto wanted = static_cast<std::size_t>(std::max(threads, 1));
  const std::size_t n = std::min(wanted, std::max<std::size_t>(1, bytes / kTouchSlice));
  if (n == 1) {
    touch_range(base, base + bytes);
    return;
  }
  const std::size_t slice = round_up(bytes / n, kHugePage);
  std::vector<std::thread> workers;
  std::size_t offset = 0;
  try {
    for (; offset + slice < bytes && workers.size() + 1 < n; offset += slice) {
      char* begin = base + offset;
      workers.emplace_back(touch_range, begin, begin + slice);
    }
  } catch (const std::system_error&) {
    // No more threads: the calling thread touches what is left.
  }
  touch_range(base + offset, base + bytes);
  for (auto& w : workers) w.join();
}

void bind(void* base, std::size_t bytes, int node) {
  unsigned long mask[kMaxNodes / (8 * sizeof(unsigned long))] = {};
  mask[node / (8 * sizeof(unsigned long))] = 1UL << (node % (8 * sizeof(unsigned long)));
  if (syscall(SYS_mbind, base, bytes, kMpolBind, mask, kMaxNodes, 0) != 0) {
    static std::once_flag once;
    say_once(once, "tide: pinned arena: binding chunks to NUMA node " + std::to_string(node) +
                       " failed (mbind: " + std::strerror(errno) +
                       "); their pages go where the kernel puts them");
  }
}

}  // namespace

void* map_chunk(std::size_t bytes, const ChunkPlacement& placement, std::uint64_t* touch_ns) {
  // Over-map by a huge page and trim both ends to get a huge-page-aligned start.
  const std::size_t span = bytes + kHugePage;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = round_up(start, kHugePage);
  if (aligned > start) munmap(raw, aligned - start);
  if (const std::size_t tail = start + span - (aligned + bytes); tail > 0) {
    munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  }
  void* base = reinterpret_cast<void*>(aligned);

  if (placement.numa_node >= 0) bind(base, bytes, placement.numa_node);
  // Advice only: where THP is off ("never"), the kernel ignores it.
  if (placement.huge_pages) madvise(base, bytes, MADV_HUGEPAGE);
  const auto t0 = std::chrono::steady_clock::now();
  touch(static_cast<char*>(base), bytes, placement.touch_threads);
  *touch_ns += static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  return base;
}

void unmap_chunk(void* base, std::size_t bytes) noexcept { munmap(base, bytes); }

bool check_numa_node(int node) {
  if (node < 0) return false;
  struct stat st {};
  if (stat("/sys/devices/system/node", &st) != 0) {
    static std::once_flag once;
    say_once(once,
             "tide: pinned arena: this system does not list its NUMA nodes "
             "(/sys/devices/system/node); chunks are not bound to node " +
                 std::to_string(node));
    return false;
  }
  const std::string path = "/sys/devices/system/node/node" + std::to_string(node);
  if (node >= kMaxNodes || stat(path.c_str(), &st) != 0) {
    throw std::invalid_argument("tide: pinned arena: no NUMA node " + std::to_string(node) +
                                " on this machine (" + path + " does not exist)");
  }
  return true;
}

int numa_node_of(const void* p) {
  int node = -1;
  if (syscall(SYS_get_mempolicy, &node, nullptr, 0, const_cast<void*>(p),
              kMpolFNode | kMpolFAddr) != 0) {
    return -1;
  }
  return node;
}

int resolve_touch_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(std::min(8u, cores));
}

}  // namespace tide::allocator::pinned
