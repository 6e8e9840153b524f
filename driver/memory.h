// Device memory, host-memory registration and copies.
#pragma once

#include <cuda.h>

#include <cstddef>

namespace tide::driver {

class Stream;

// One cuMemAlloc'd buffer.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  CUdeviceptr get() const { return ptr_; }
  std::size_t size() const { return bytes_; }

 private:
  CUdeviceptr ptr_ = 0;
  std::size_t bytes_ = 0;
};

// Host memory page-locked and registered with the driver for as long as this object lives, so
// that async copies from and to it are truly asynchronous.
class HostRegistration {
 public:
  HostRegistration() = default;
  // `flags`: CU_MEMHOSTREGISTER_* (portable by default: usable from every context).
  HostRegistration(void* ptr, std::size_t bytes, unsigned flags = CU_MEMHOSTREGISTER_PORTABLE);
  ~HostRegistration();
  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

  void* get() const { return ptr_; }
  std::size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

void copy_to_device_async(CUdeviceptr dst, const void* src, std::size_t bytes, const Stream& s);
void copy_to_host_async(void* dst, CUdeviceptr src, std::size_t bytes, const Stream& s);
void copy_on_device_async(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, const Stream& s);
void copy_to_device(CUdeviceptr dst, const void* src, std::size_t bytes);
void fill_zero_async(CUdeviceptr dst, std::size_t bytes, const Stream& s);
void copy_to_host(void* dst, CUdeviceptr src, std::size_t bytes);

// Whether `ptr` is host memory the CPU writes directly: page-locked host memory, or ordinary
// memory the driver does not know (a device addresses it through HMM/ATS, as the stand-in's CPU
// mode does with CPU tensors). False for device and managed memory, or when the driver cannot
// say. Needs the device's context current.
bool host_addressable(CUdeviceptr ptr);

}  // namespace tide::driver
