// For the files that define the exported cu* entry points: include it first.
//
// It makes cuda.h declare every variant of each driver function under its real symbol name (the
// legacy one, _v2, _ptds/_ptsz), as it does for the driver's own build, so that the compiler
// checks each export's signature against NVIDIA's declaration.
#pragma once

#ifdef __cuda_cuda_h__
#error "standin/exports.h must come before any other include of cuda.h"
#endif
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <new>

#include "standin/contexts.h"
#include "standin/faults.h"

#define TIDE_STANDIN_EXPORT extern "C" __attribute__((visibility("default")))

namespace tide::standin {

// Runs an entry point's body; no exception leaves the library (a driver returns error codes).
template <typename Body>
CUresult guarded(Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

// The ordinary entry point: counted, and only after cuInit.
template <typename Body>
CUresult call(Body&& body) noexcept {
  return guarded([&] {
    if (CUresult r = enter(); r != CUDA_SUCCESS) return r;
    return body();
  });
}

// An entry point that needs a current context: without one (or with a destroyed one) it fails
// before doing anything, as in CUDA, whatever handles it is given.
template <typename Body>
CUresult call_in_context(Body&& body) noexcept {
  return call([&] {
    if (CUresult r = require_current_context(); r != CUDA_SUCCESS) return r;
    return body();
  });
}

// Counted, but usable before cuInit.
template <typename Body>
CUresult call_uninitialized(Body&& body) noexcept {
  return guarded([&] {
    if (CUresult r = enter_uninitialized(); r != CUDA_SUCCESS) return r;
    return body();
  });
}

}  // namespace tide::standin
