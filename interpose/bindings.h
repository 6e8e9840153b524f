// Hooks bound to the exact function the driver (or runtime) handed out.
//
// Every hook the interposer returns from dlsym or cuGetProcAddress is one of kSlotsPerKind
// instances of its Kind's hook, each bound to one real function: the very pointer the lookup
// would have returned without the interposer. So a caller that asked for the per-thread-stream
// variant, or for the function of some CUDA version, ends up in exactly that function, through a
// hook with exactly its signature.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>

#include "interpose/entry_points.h"

namespace tide::interpose {

struct Binding {
  std::atomic<void*> real{nullptr};
  // cuCtxGetCurrent and cuCtxGetDevice from the same library as `real`, found on first use.
  std::atomic<void*> ctx_get_current{nullptr};
  std::atomic<void*> ctx_get_device{nullptr};
  std::atomic<bool> companions_resolved{false};

  template <typename Fn>
  Fn fn() const {
    return reinterpret_cast<Fn>(real.load(std::memory_order_acquire));
  }
};

inline constexpr std::size_t kSlotsPerKind = 8;

// The hook of `kind` bound to `real`: an existing binding of the same function, or a free slot.
// nullptr when all slots are bound to other functions (the caller then gets `real` unhooked).
void* bind(Kind kind, void* real);

// dlsym(handle, name) for a name that may be hooked: glibc's answer, replaced by its hook.
// nullptr to let glibc's dlsym answer.
void* intercept_dlsym(void* handle, const char* name);

// The device of the calling thread's current context, from the driver `binding` belongs to
// (0 when there is none).
int current_device(Binding& binding);

// Lookups the hooks could not bind because every slot was taken (reported).
std::size_t unbound_lookups();

// Whether a bound driver function belongs to tide's host stand-in driver (which exports
// tide_standin_stat): what the process calls device memory is then host memory, and no GPU.
bool bound_to_standin();

// Looks up `name` in the library that holds `function` (how the hooks find a companion such as
// cuCtxGetDevice in the driver they are bound to). nullptr when absent.
void* companion_symbol(const void* function, const char* name);

}  // namespace tide::interpose
