// Bindings for the preload's exported hooks (cuMemAlloc_v2, cudaMalloc, ...), reached through a
// caller's PLT rather than through dlsym or cuGetProcAddress.
//
// The real function is the one the caller would have bound to without the preload: looked up in
// the caller's own scope (the caller and its dependencies: a library loaded RTLD_LOCAL with its
// own libcudart finds that one), then after the preload in the global scope, then in an already
// loaded object that has it (a tail call hides the real caller). Cached per calling object.
#pragma once

#include <atomic>

#include "interpose/bindings.h"

namespace tide::interpose {

struct PltSite {
  struct Caller {
    std::atomic<int> state{0};  // 0 free, 1 being filled, 2 ready
    const void* object = nullptr;
    Binding binding;
  };

  constexpr PltSite(const char* symbol, Kind hook_kind) : name(symbol), kind(hook_kind) {}

  const char* name;
  Kind kind;
  Caller callers[4];
};

// The binding for a call from `return_address`. Its `real` is null when the function exists
// nowhere the caller could have reached (the hook then returns the entry point's error code).
Binding& caller_binding(PltSite& site, void* return_address);

}  // namespace tide::interpose
