// How C ABI functions turn C++ exceptions into a tide_status and a per-thread message.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "tide/tide.h"

namespace tide::capi {

// Counts one entry into the C ABI on this thread (tide_abi_calls): every exported tide_* function
// calls it once, through guard() or directly.
void count_call() noexcept;
std::uint64_t calls() noexcept;

// Records `message` as this thread's last error (what tide_last_error() returns).
void set_last_error(std::string message);
void clear_last_error();
const char* last_error_text();

// Counts the call (count_call), runs `body` (returning void) and maps whatever it throws onto a
// status: bad arguments and bad TIDE_* values → TIDE_ERROR_INVALID_ARGUMENT, no driver →
// TIDE_ERROR_NO_DRIVER, a failed CUDA call → TIDE_ERROR_CUDA (TIDE_ERROR_OUT_OF_MEMORY for
// CUDA_ERROR_OUT_OF_MEMORY), bad_alloc → TIDE_ERROR_OUT_OF_MEMORY, anything else →
// TIDE_ERROR_INTERNAL.
template <typename Body>
tide_status guard(Body&& body) noexcept;

tide_status status_of_current_exception() noexcept;

// A C ABI function's check of its arguments: throws std::invalid_argument (which guard() turns
// into TIDE_ERROR_INVALID_ARGUMENT with `message` as the last error) unless `condition` holds.
inline void require(bool condition, std::string_view message) {
  if (!condition) throw std::invalid_argument(std::string(message));
}

template <typename Body>
tide_status guard(Body&& body) noexcept {
  count_call();
  try {
    clear_last_error();
    body();
    return TIDE_OK;
  } catch (...) {
    return status_of_current_exception();
  }
}

}  // namespace tide::capi
