// Per-thread state of the interposer: the recursion guard and the runtime call in progress.
//
// Initial-exec TLS: the preload is loaded at start-up, so its TLS is static and an access is one
// instruction; the default (global-dynamic) model would call __tls_get_addr, which may allocate
// on a thread's first access, from inside a hook.
#pragma once

#include <cstdint>

#include "interpose/entry_points.h"

namespace tide::interpose {

struct ThreadState {
  // Driver hooks active on this thread. A driver hook reached from inside another (a driver that
  // implements one entry point with another, a chain of interposers, tide's own code running
  // from a hook) passes straight through, so nothing is counted twice.
  std::uint32_t depth = 0;
  // The runtime call (cudaMalloc, ...) in progress on this thread, for attribution: the driver
  // hook underneath records it as the allocation's origin. Kind::count when none.
  Kind runtime_call = Kind::count;
  // Allocations and frees the driver hooks recorded on this thread: a runtime hook that sees no
  // change knows the driver call underneath escaped the driver hooks and records it itself.
  std::uint64_t driver_records = 0;
};

inline constinit thread_local ThreadState g_thread_state
    __attribute__((tls_model("initial-exec"))) = {};

inline ThreadState& thread_state() { return g_thread_state; }

// Marks the thread as inside a driver hook for its lifetime.
class DriverHookScope {
 public:
  DriverHookScope() { ++g_thread_state.depth; }
  ~DriverHookScope() { --g_thread_state.depth; }
  DriverHookScope(const DriverHookScope&) = delete;
  DriverHookScope& operator=(const DriverHookScope&) = delete;
};

inline bool inside_driver_hook() { return g_thread_state.depth > 0; }

}  // namespace tide::interpose
