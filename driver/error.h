// Errors from the driver layer. Every failed driver call becomes a CudaError that names the call,
// the error's name and its text, e.g. "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (out of
// memory)".
#pragma once

#include <cuda.h>

#include <stdexcept>
#include <string>

namespace tide::driver {

class DriverNotFound : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class CudaError : public std::runtime_error {
 public:
  CudaError(const char* call, CUresult result);
  CUresult result() const { return result_; }
  const std::string& call() const { return call_; }

 private:
  std::string call_;
  CUresult result_;
};

// Throws CudaError(call, result) unless result is CUDA_SUCCESS.
inline void check(CUresult result, const char* call) {
  if (result != CUDA_SUCCESS) throw CudaError(call, result);
}

// For destructors, which cannot throw: prints CudaError(call, result)'s message to stderr
// unless result is CUDA_SUCCESS, or CUDA_ERROR_DEINITIALIZED (the driver is shutting down with
// the process: what the call would have ended ends with it).
void report(CUresult result, const char* call) noexcept;

}  // namespace tide::driver

// Calls cuda().fn(args...) and throws a CudaError naming `fn` if it fails.
#define TIDE_CU(fn, ...) ::tide::driver::check(::tide::driver::cuda().fn(__VA_ARGS__), #fn)
