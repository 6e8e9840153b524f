// Running out of memory, as opposed to a broken device: only this makes a GPU subgroup of a plan
// fall back to the CPU without counting as a fault.
#pragma once

#include <exception>
#include <new>

#include "driver/error.h"

namespace tide::runtime {

inline bool out_of_memory(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const driver::CudaError& e) {
    return e.result() == CUDA_ERROR_OUT_OF_MEMORY;
  } catch (const std::bad_alloc&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace tide::runtime
