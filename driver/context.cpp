#include "driver/context.h"

#include "driver/cuda_api.h"
#include "driver/error.h"

namespace tide::driver {

int device_count() {
  int count = 0;
  TIDE_CU(cuDeviceGetCount, &count);
  return count;
}

std::string device_name(int device) {
  CUdevice handle = 0;
  TIDE_CU(cuDeviceGet, &handle, device);
  char name[256] = {};
  TIDE_CU(cuDeviceGetName, name, static_cast<int>(sizeof name), handle);
  return name;
}

MemoryInfo memory_info() {
  MemoryInfo info{};
  TIDE_CU(cuMemGetInfo, &info.free_bytes, &info.total_bytes);
  return info;
}

PrimaryContext::PrimaryContext(int device) : ordinal_(device) {
  TIDE_CU(cuDeviceGet, &device_, device);
  TIDE_CU(cuDevicePrimaryCtxRetain, &context_, device_);
  make_current();
}

PrimaryContext::~PrimaryContext() { cuda().cuDevicePrimaryCtxRelease(device_); }

void PrimaryContext::make_current() const { TIDE_CU(cuCtxSetCurrent, context_); }

}  // namespace tide::driver
