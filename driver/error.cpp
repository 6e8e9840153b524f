#include "driver/error.h"

#include <cstdio>

#include "driver/cuda_api.h"

namespace tide::driver {
namespace {

// The driver's own words for `result`, if a driver is loaded; a number otherwise.
std::string describe(CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  try {
    const CudaApi& api = cuda();
    api.cuGetErrorName(result, &name);
    api.cuGetErrorString(result, &text);
  } catch (const std::exception&) {
    // No driver: fall through to the number.
  }
  std::string out =
      name != nullptr ? name : "CUDA error " + std::to_string(static_cast<int>(result));
  if (text != nullptr) out += std::string(" (") + text + ")";
  return out;
}

}  // namespace

CudaError::CudaError(const char* call, CUresult result)
    : std::runtime_error(std::string(call) + " failed: " + describe(result)),
      call_(call),
      result_(result) {}

void report(CUresult result, const char* call) noexcept {
  if (result == CUDA_SUCCESS || result == CUDA_ERROR_DEINITIALIZED) return;
  try {
    std::fprintf(stderr, "tide: %s\n", CudaError(call, result).what());
  } catch (...) {
    std::fprintf(stderr, "tide: %s failed: CUDA error %d\n", call, static_cast<int>(result));
  }
}

}  // namespace tide::driver
