// The device context the allocator's driver calls run in, without disturbing the caller's.
//
// PyTorch calls the allocator on a thread where the device's primary context is current, and
// expects it to stay current. The allocator retains the primary context of its device once
// (cuDevicePrimaryCtxRetain does not make it current, unlike driver::PrimaryContext), and its
// slow paths make it current only when it is not already, putting the caller's back afterwards.
#pragma once

#include <cuda.h>

namespace tide::allocator::device {

class DeviceContext {
 public:
  explicit DeviceContext(int device);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  int device() const { return ordinal_; }
  CUcontext get() const { return context_; }

 private:
  int ordinal_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
};

// Makes `context` current on this thread for the scope if it is not already.
class ContextScope {
 public:
  explicit ContextScope(const DeviceContext& context);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

}  // namespace tide::allocator::device
