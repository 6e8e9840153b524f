#include "allocator/pinned/arena.h"

#include <jemalloc/jemalloc.h>

#include <bit>
#include <cstddef>
#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>

#include "allocator/pinned/chunk_hooks.h"
#include "allocator/pinned/memory.h"
#include "allocator/pinned/registration.h"

// libtide.so's private jemalloc (prefix tide_je_) serves pinned arenas only; this is its
// program-wide configuration, read once when jemalloc starts (the build adds retain:false).
//  - tcache:false: a thread cache is shared by every arena the thread uses, so a region freed to
//    one pinned arena could be handed out by another (another NUMA node), and it would keep
//    regions of a destroyed arena. Pinned arenas pass MALLOCX_TCACHE_NONE anyway; this also
//    stops jemalloc from building an unused cache for each thread that calls it.
// (jemalloc also pads each of its large allocations by a page, to start it at a random cache
// line; that is a build option, not a runtime one. Buffers of direct_bytes and up do not go
// through jemalloc, so the pad costs at most 4 KiB per allocation below 1 MiB.)
extern "C" const char* tide_je_malloc_conf;
const char* tide_je_malloc_conf = "tcache:false";

namespace tide::allocator::pinned {
namespace {

// How long jemalloc keeps extents freed in this arena before returning them to the chunks (its
// default is 10 s). 0 would return them at once, but then a slab that empties is given back and
// fetched again on the next allocation: warm allocate+free measured 630 ns instead of 240 ns
// (bench_pinned). What jemalloc keeps is its own small allocations' memory (under direct_bytes),
// and trim() returns it at once. (Decay advances when the arena is used; no background thread.)
constexpr ssize_t kDirtyDecayMs = 1000;

void mallctl_or_throw(const char* name, void* out, std::size_t* out_len, void* in,
                      std::size_t in_len) {
  if (int r = tide_je_mallctl(name, out, out_len, in, in_len); r != 0) {
    throw std::runtime_error(std::string("tide: pinned arena: jemalloc mallctl ") + name +
                             " failed (error " + std::to_string(r) + ")");
  }
}

void rethrow_hook_error_or_bad_alloc() {
  if (std::exception_ptr e = take_hook_error()) std::rethrow_exception(e);
  throw std::bad_alloc();
}

}  // namespace

PinnedArena::PinnedArena(const PinnedOptions& options) : options_(options) {
  options_.validate();
  PinnedOptions placement = options_;
  // Where the kernel does not list NUMA nodes, chunks are not bound (said once).
  if (!check_numa_node(options_.numa_node)) placement.numa_node = -1;
  registrar_ = std::make_unique<Registrar>(options_.device);
  pool_ = std::make_unique<ChunkPool>(placement, *registrar_);
  hooks_ = std::make_unique<PinnedExtentHooks>(*pool_);

  // jemalloc allocates the arena's metadata through the hooks right away.
  extent_hooks_t* hooks = &hooks_->hooks;
  std::size_t len = sizeof(arena_);
  clear_hook_error();
  if (tide_je_mallctl("arenas.create", &arena_, &len, &hooks, sizeof(extent_hooks_t*)) != 0) {
    rethrow_hook_error_or_bad_alloc();
  }
  flags_ = MALLOCX_ARENA(arena_) | MALLOCX_TCACHE_NONE;
  try {
    ssize_t decay = kDirtyDecayMs;
    mallctl_arena("dirty_decay_ms", nullptr, nullptr, &decay, sizeof(decay));
  } catch (...) {
    destroy_jemalloc_arena();  // its hooks die with this object
    throw;
  }
}

PinnedArena::~PinnedArena() {
  destroy_jemalloc_arena();
  // The pool then unregisters and unmaps its chunks.
  hooks_.reset();
  pool_.reset();
  registrar_.reset();
}

void PinnedArena::destroy_jemalloc_arena() noexcept {
  // Frees everything jemalloc gave and returns every extent, its metadata included, through the
  // hooks.
  char name[64];
  std::snprintf(name, sizeof name, "arena.%u.destroy", arena_);
  tide_je_mallctl(name, nullptr, nullptr, nullptr, 0);
}

void PinnedArena::mallctl_arena(const char* name, void* out, std::size_t* out_len, void* in,
                                std::size_t in_len) const {
  const std::string full = "arena." + std::to_string(arena_) + "." + name;
  mallctl_or_throw(full.c_str(), out, out_len, in, in_len);
}

bool PinnedArena::pinned() const { return registrar_->pinned(); }

void* PinnedArena::allocate(std::size_t bytes, std::size_t alignment) {
  if (alignment == 0) alignment = kDefaultAlignment;
  if (!std::has_single_bit(alignment) || alignment > kHugePage) {
    throw std::invalid_argument("tide: pinned alloc: alignment " + std::to_string(alignment) +
                                " is not a power of two up to 2 MiB");
  }
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  if (bytes >= options_.direct_bytes) {
    p = pool_->allocate_buffer(bytes, alignment);
  } else {
    clear_hook_error();
    p = tide_je_mallocx(bytes, flags_ | MALLOCX_LG_ALIGN(std::countr_zero(alignment)));
    if (p == nullptr) rethrow_hook_error_or_bad_alloc();
  }
  const std::uint64_t now = requested_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::uint64_t peak = peak_requested_.load(std::memory_order_relaxed);
  while (now > peak &&
         !peak_requested_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  allocations_.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void PinnedArena::deallocate(void* p, std::size_t bytes) {
  if (p == nullptr) return;
  if (bytes >= options_.direct_bytes) {
    pool_->deallocate_buffer(p, bytes);
  } else {
    // jemalloc would crash on a foreign pointer; the pool can tell one cheaply.
    if (!pool_->holds_extent_pointer(p)) {
      throw std::invalid_argument(
          "tide: pinned free: the pointer is not from this arena, or its size is wrong");
    }
    tide_je_dallocx(p, MALLOCX_TCACHE_NONE);
  }
  requested_.fetch_sub(bytes, std::memory_order_relaxed);
  frees_.fetch_add(1, std::memory_order_relaxed);
}

void PinnedArena::trim() {
  // Returns what jemalloc still caches (with decay 0, little) through the dalloc hook.
  mallctl_arena("purge", nullptr, nullptr, nullptr, 0);
  pool_->release_free_chunks();
}

PinnedStats PinnedArena::stats() const {
  PinnedStats s;
  s.requested_bytes = requested_.load(std::memory_order_relaxed);
  s.peak_requested_bytes = peak_requested_.load(std::memory_order_relaxed);
  s.allocations = allocations_.load(std::memory_order_relaxed);
  s.frees = frees_.load(std::memory_order_relaxed);

  // jemalloc's statistics are snapshots, refreshed by writing "epoch".
  std::uint64_t epoch = 1;
  std::size_t len = sizeof(epoch);
  mallctl_or_throw("epoch", &epoch, &len, &epoch, sizeof(epoch));
  for (const char* kind : {"small", "large"}) {
    std::size_t allocated = 0;
    len = sizeof(allocated);
    const std::string name = "stats.arenas." + std::to_string(arena_) + "." + kind + ".allocated";
    mallctl_or_throw(name.c_str(), &allocated, &len, nullptr, 0);
    s.jemalloc_allocated_bytes += allocated;
  }

  const ChunkPoolStats p = pool_->stats();
  s.jemalloc_extent_bytes = p.extent_bytes;
  s.direct_bytes = p.buffer_bytes;
  s.allocated_bytes = s.jemalloc_allocated_bytes + s.direct_bytes;
  s.pinned_bytes = p.pinned_bytes;
  s.peak_pinned_bytes = p.peak_pinned_bytes;
  s.free_chunk_bytes = p.free_chunk_bytes;
  s.chunks = p.chunks;
  s.chunks_mapped = p.chunks_mapped;
  s.chunks_released = p.chunks_released;
  s.unregister_failures = p.unregister_failures;
  s.touch_ns = p.touch_ns;
  s.register_ns = registrar_->register_ns();
  s.unregister_ns = registrar_->unregister_ns();
  s.pinned = pinned() ? 1 : 0;
  return s;
}

}  // namespace tide::allocator::pinned
