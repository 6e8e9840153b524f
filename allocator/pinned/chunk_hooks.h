// jemalloc extent hooks that take a pinned arena's extents from its chunk pool.
#pragma once

#include <jemalloc/jemalloc.h>

#include <exception>

namespace tide::allocator::pinned {

class ChunkPool;

// The hook table of one arena. jemalloc passes &hooks back to every hook, which finds its pool
// from there; the table must outlive the jemalloc arena that uses it.
struct PinnedExtentHooks {
  explicit PinnedExtentHooks(ChunkPool& pool);

  extent_hooks_t hooks;  // first member: a hook converts its extent_hooks_t* back to this
  ChunkPool* pool;
};

// A hook cannot throw through jemalloc (C code): a failing alloc hook returns null and keeps its
// exception here, for the thread that called into jemalloc to rethrow.
void clear_hook_error() noexcept;
std::exception_ptr take_hook_error() noexcept;

}  // namespace tide::allocator::pinned
