// The C ABI's general part: version, errors, driver. Each component implements the tide_*
// functions of its own area next to its code (e.g. capi/kernels.cpp).
#include "tide/tide.h"

#include <stdexcept>

#include "capi/status.h"
#include "driver/context.h"
#include "driver/cuda_api.h"

namespace {

using tide::capi::require;

}  // namespace

extern "C" {

TIDE_API const char* tide_version(void) { return TIDE_VERSION_STRING; }

TIDE_API const char* tide_last_error(void) { return tide::capi::last_error_text(); }

TIDE_API tide_status tide_driver_info(int* device_count, int* driver_version) {
  return tide::capi::guard([&] {
    require(device_count != nullptr && driver_version != nullptr,
            "tide_driver_info: null output pointer");
    const auto& api = tide::driver::cuda();
    *device_count = tide::driver::device_count();
    *driver_version = api.version;
  });
}

TIDE_API tide_status tide_device_memory(int device, size_t* free_bytes, size_t* total_bytes) {
  return tide::capi::guard([&] {
    require(free_bytes != nullptr && total_bytes != nullptr,
            "tide_device_memory: null output pointer");
    require(device >= 0 && device < tide::driver::device_count(),
            "tide_device_memory: no such device");
    const tide::driver::PrimaryContext context(device);
    const tide::driver::ContextScope scope(context);
    const auto info = tide::driver::memory_info();
    *free_bytes = info.free_bytes;
    *total_bytes = info.total_bytes;
  });
}

}  // extern "C"
