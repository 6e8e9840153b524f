// The semantics of each hook are jemalloc's (`man jemalloc`, "arena.<i>.extent_hooks"): a hook
// that returns true (or null) has failed or opted out, and jemalloc copes.
#include "allocator/pinned/chunk_hooks.h"

#include <cstddef>
#include <cstring>

#include "allocator/pinned/chunks.h"

namespace tide::allocator::pinned {
namespace {

thread_local std::exception_ptr hook_error;

static_assert(offsetof(PinnedExtentHooks, hooks) == 0);

ChunkPool& pool_of(extent_hooks_t* hooks) {
  return *reinterpret_cast<PinnedExtentHooks*>(hooks)->pool;
}

void* alloc_hook(extent_hooks_t* hooks, void* new_addr, std::size_t size, std::size_t alignment,
                 bool* zero, bool* commit, unsigned /*arena_ind*/) {
  // jemalloc asks for a given address only to grow an extent in place (realloc); declining is
  // allowed, and pinned buffers are not reallocated.
  if (new_addr != nullptr) return nullptr;
  void* p = nullptr;
  try {
    p = pool_of(hooks).allocate_extent(size, alignment);
  } catch (...) {
    hook_error = std::current_exception();
    return nullptr;
  }
  // Ranges are reused, so their contents are whatever was there; zero them only when asked.
  if (*zero) std::memset(p, 0, size);
  *commit = true;  // chunks are always committed: they are touched and registered
  return p;
}

bool dalloc_hook(extent_hooks_t* hooks, void* addr, std::size_t size, bool /*committed*/,
                 unsigned /*arena_ind*/) {
  pool_of(hooks).deallocate_extent(addr, size);
  return false;
}

void destroy_hook(extent_hooks_t* hooks, void* addr, std::size_t size, bool /*committed*/,
                  unsigned /*arena_ind*/) {
  pool_of(hooks).deallocate_extent(addr, size);
}

bool commit_hook(extent_hooks_t*, void*, std::size_t, std::size_t, std::size_t, unsigned) {
  return false;  // already committed: nothing to do, success
}

bool split_hook(extent_hooks_t*, void*, std::size_t, std::size_t, std::size_t, bool, unsigned) {
  return false;  // both halves stay in the chunk, and in its registration
}

bool merge_hook(extent_hooks_t* hooks, void* addr_a, std::size_t /*size_a*/, void* addr_b,
                std::size_t /*size_b*/, bool /*committed*/, unsigned /*arena_ind*/) {
  // Chunks mapped next to each other are still separate registrations: an extent across the
  // boundary would hand out memory no single registration covers, and could not be unregistered.
  return !pool_of(hooks).same_chunk(addr_a, addr_b);
}

}  // namespace

PinnedExtentHooks::PinnedExtentHooks(ChunkPool& p)
    : hooks{
          .alloc = alloc_hook,
          .dalloc = dalloc_hook,
          .destroy = destroy_hook,
          .commit = commit_hook,
          // No decommit or purge: madvise(MADV_DONTNEED) or MADV_FREE on registered pages would
          // swap new physical pages in under the driver's mapping. jemalloc keeps the memory
          // committed and returns it through dalloc instead.
          .decommit = nullptr,
          .purge_lazy = nullptr,
          .purge_forced = nullptr,
          .split = split_hook,
          .merge = merge_hook,
      },
      pool(&p) {}

void clear_hook_error() noexcept { hook_error = nullptr; }

std::exception_ptr take_hook_error() noexcept {
  std::exception_ptr e = std::move(hook_error);
  hook_error = nullptr;
  return e;
}

}  // namespace tide::allocator::pinned
