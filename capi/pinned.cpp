// The C ABI of pinned host arenas (include/tide/tide.h, "pinned host arenas").
#include <cstddef>
#include <memory>
#include <stdexcept>

#include "allocator/pinned/arena.h"
#include "allocator/pinned/node_limit.h"
#include "capi/status.h"
#include "capi/versioned.h"
#include "tide/tide.h"

struct tide_pinned_arena {
  explicit tide_pinned_arena(const tide::allocator::pinned::PinnedOptions& options)
      : arena(options) {}
  tide::allocator::pinned::PinnedArena arena;
};

namespace {

using tide::capi::require;

tide::allocator::pinned::PinnedOptions from_c(const tide_pinned_options& o) {
  tide::allocator::pinned::PinnedOptions options;
  options.chunk_bytes = o.chunk_bytes;
  options.direct_bytes = o.direct_bytes;
  options.retain_bytes = o.retain_bytes;
  options.numa_node = o.numa_node;
  options.device = o.device;
  options.huge_pages = o.huge_pages != 0;
  options.touch_threads = o.touch_threads;
  return options;
}

// The defaults: the TIDE_PINNED_* variables over the built-in values.
tide_pinned_options environment_defaults() {
  const auto o = tide::allocator::pinned::PinnedOptions::from_environment();
  return tide_pinned_options{sizeof(tide_pinned_options),
                             o.chunk_bytes,
                             o.direct_bytes,
                             o.retain_bytes,
                             o.numa_node,
                             o.device,
                             o.huge_pages ? 1 : 0,
                             o.touch_threads};
}

}  // namespace

extern "C" {

TIDE_API tide_status tide_pinned_options_init(tide_pinned_options* options) {
  return tide::capi::guard([&] {
    require(options != nullptr, "tide_pinned_options_init: null options");
    tide::capi::write_versioned(options, environment_defaults(), "tide_pinned_options");
  });
}

TIDE_API tide_status tide_pinned_arena_create(const tide_pinned_options* options,
                                              tide_pinned_arena** arena) {
  return tide::capi::guard([&] {
    require(arena != nullptr, "tide_pinned_arena_create: null output pointer");
    *arena = nullptr;
    // The environment only fills what an older caller's struct lacks.
    const auto o = options == nullptr ? tide::allocator::pinned::PinnedOptions::from_environment()
                   : options->struct_size == sizeof(tide_pinned_options)
                       ? from_c(*options)
                       : from_c(tide::capi::read_versioned(*options, environment_defaults(),
                                                           "tide_pinned_options"));
    *arena = new tide_pinned_arena(o);
  });
}

TIDE_API tide_status tide_pinned_arena_destroy(tide_pinned_arena* arena) {
  return tide::capi::guard([&] { delete arena; });
}

TIDE_API tide_status tide_pinned_alloc(tide_pinned_arena* arena, size_t bytes, size_t alignment,
                                       void** ptr) {
  return tide::capi::guard([&] {
    require(arena != nullptr && ptr != nullptr, "tide_pinned_alloc: null arena or output pointer");
    *ptr = nullptr;
    *ptr = arena->arena.allocate(bytes, alignment);
  });
}

TIDE_API tide_status tide_pinned_free(tide_pinned_arena* arena, void* ptr, size_t bytes) {
  return tide::capi::guard([&] {
    require(arena != nullptr, "tide_pinned_free: null arena");
    arena->arena.deallocate(ptr, bytes);
  });
}

TIDE_API tide_status tide_pinned_arena_trim(tide_pinned_arena* arena) {
  return tide::capi::guard([&] {
    require(arena != nullptr, "tide_pinned_arena_trim: null arena");
    arena->arena.trim();
  });
}

TIDE_API tide_status tide_pinned_arena_stats(const tide_pinned_arena* arena,
                                             tide_pinned_stats* stats) {
  return tide::capi::guard([&] {
    require(arena != nullptr && stats != nullptr, "tide_pinned_arena_stats: null argument");
    const tide::allocator::pinned::PinnedStats s = arena->arena.stats();
    static_assert(sizeof(tide_pinned_stats) ==
                  sizeof(std::size_t) + sizeof(tide::allocator::pinned::PinnedStats));
    tide::capi::check_struct_size<tide_pinned_stats>(stats->struct_size, "tide_pinned_stats");
    const tide_pinned_stats out{sizeof(tide_pinned_stats),
                                s.requested_bytes,
                                s.peak_requested_bytes,
                                s.allocated_bytes,
                                s.jemalloc_allocated_bytes,
                                s.jemalloc_extent_bytes,
                                s.direct_bytes,
                                s.pinned_bytes,
                                s.peak_pinned_bytes,
                                s.free_chunk_bytes,
                                s.chunks,
                                s.chunks_mapped,
                                s.chunks_released,
                                s.unregister_failures,
                                s.allocations,
                                s.frees,
                                s.register_ns,
                                s.unregister_ns,
                                s.touch_ns,
                                s.pinned};
    tide::capi::write_versioned(stats, out, "tide_pinned_stats");
  });
}

TIDE_API tide_status tide_node_pinned_stats(tide_node_pinned* stats) {
  return tide::capi::guard([&] {
    require(stats != nullptr, "tide_node_pinned_stats: null argument");
    const tide::allocator::pinned::NodePinned n = tide::allocator::pinned::node_pinned();
    tide::capi::write_versioned(
        stats,
        tide_node_pinned{sizeof(tide_node_pinned), n.node_limit_bytes, n.rank_limit_bytes,
                         n.pinned_bytes, n.peak_pinned_bytes, n.local_rank, n.local_ranks},
        "tide_node_pinned");
  });
}

}  // extern "C"
