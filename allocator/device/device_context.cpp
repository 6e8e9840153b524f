#include "allocator/device/device_context.h"

#include "driver/cuda_api.h"
#include "driver/error.h"

namespace tide::allocator::device {

DeviceContext::DeviceContext(int device) : ordinal_(device) {
  TIDE_CU(cuDeviceGet, &device_, device);
  TIDE_CU(cuDevicePrimaryCtxRetain, &context_, device_);
}

DeviceContext::~DeviceContext() { driver::cuda().cuDevicePrimaryCtxRelease(device_); }

ContextScope::ContextScope(const DeviceContext& context) {
  TIDE_CU(cuCtxGetCurrent, &previous_);
  if (previous_ != context.get()) {
    TIDE_CU(cuCtxSetCurrent, context.get());
    switched_ = true;
  }
}

ContextScope::~ContextScope() {
  // Restoring a null context is what the caller had: leave no context current.
  if (switched_) driver::cuda().cuCtxSetCurrent(previous_);
}

}  // namespace tide::allocator::device
