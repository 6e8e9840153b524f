#include "allocator/pinned/options.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>

#include "config/env.h"
#include "config/knobs.h"
#include "config/node.h"
#include "driver/node_share.h"

namespace tide::allocator::pinned {

PinnedOptions PinnedOptions::from_environment() {
  PinnedOptions o;
  // The ranges validate() checks, so that a bad value is reported under the variable's name.
  if (auto v = config::env_bytes("TIDE_PINNED_CHUNK", 4 * kMiB, std::size_t{1} << 40,
                                 config::kPinnedChunkAccepts)) {
    o.chunk_bytes = *v;
  }
  if (auto v = config::env_bytes("TIDE_PINNED_DIRECT", 16 * 1024, std::size_t{1} << 40,
                                 config::kPinnedDirectAccepts)) {
    o.direct_bytes = *v;
  }
  if (auto v = config::env_bytes("TIDE_PINNED_RETAIN")) o.retain_bytes = *v;
  if (auto v = config::env_int("TIDE_PINNED_NUMA_NODE", -1, 1023)) {
    o.numa_node = static_cast<int>(*v);
  } else if (config::local_ranks().size > 1 && config::this_topology().nodes.size() > 1) {
    // A rank that shares a node with others keeps its pinned chunks where its cores are.
    o.numa_node = driver::this_core_share().numa_node;
  }
  if (auto v = config::env_bool("TIDE_PINNED_HUGEPAGES")) o.huge_pages = *v;
  if (auto v = config::env_int("TIDE_PINNED_TOUCH_THREADS", 0, 256)) {
    o.touch_threads = static_cast<int>(*v);
  }
  o.validate();
  return o;
}

void PinnedOptions::validate() const {
  auto fail = [](const std::string& what) {
    throw std::invalid_argument("tide: pinned arena options: " + what);
  };
  // A chunk must hold jemalloc's first metadata block (2 MiB, 2 MiB-aligned) and then some.
  if (chunk_bytes < 4 * kMiB) fail("chunk_bytes must be at least 4 MiB");
  if (chunk_bytes > (std::size_t{1} << 40)) fail("chunk_bytes must be at most 1 TiB");
  // jemalloc's small size classes end at 14 KiB; below 16 KiB there is nothing to bypass.
  if (direct_bytes < 16 * 1024) fail("direct_bytes must be at least 16 KiB");
  if (direct_bytes > (std::size_t{1} << 40)) fail("direct_bytes must be at most 1 TiB");
  if (numa_node < -1 || numa_node > 1023) fail("numa_node must be -1 (none) or 0 to 1023");
  if (device < 0) fail("device must be >= 0");
  if (touch_threads < 0 || touch_threads > 256) fail("touch_threads must be 0 to 256");
}

}  // namespace tide::allocator::pinned
