// Devices and their primary contexts.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <string>

namespace tide::driver {

int device_count();
std::string device_name(int device);

struct MemoryInfo {
  std::size_t free_bytes;
  std::size_t total_bytes;
};
// Of the device whose context is current.
MemoryInfo memory_info();

// A retained primary context of one device; made current on the constructing thread. Other
// threads call make_current() before using it.
class PrimaryContext {
 public:
  explicit PrimaryContext(int device = 0);
  ~PrimaryContext();
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;

  void make_current() const;
  int device() const { return ordinal_; }
  CUcontext get() const { return context_; }

 private:
  int ordinal_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
};

}  // namespace tide::driver
