#include "driver/memory.h"

#include <utility>

#include "driver/cuda_api.h"
#include "driver/error.h"
#include "driver/stream.h"

namespace tide::driver {

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) { TIDE_CU(cuMemAlloc, &ptr_, bytes); }

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != 0) cuda().cuMemFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  std::swap(ptr_, other.ptr_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

HostRegistration::HostRegistration(void* ptr, std::size_t bytes, unsigned flags)
    : ptr_(ptr), bytes_(bytes) {
  TIDE_CU(cuMemHostRegister, ptr, bytes, flags);
}

HostRegistration::~HostRegistration() {
  if (ptr_ != nullptr) cuda().cuMemHostUnregister(ptr_);
}

HostRegistration::HostRegistration(HostRegistration&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

HostRegistration& HostRegistration::operator=(HostRegistration&& other) noexcept {
  std::swap(ptr_, other.ptr_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

void copy_to_device_async(CUdeviceptr dst, const void* src, std::size_t bytes, const Stream& s) {
  TIDE_CU(cuMemcpyHtoDAsync, dst, src, bytes, s.get());
}

void fill_zero_async(CUdeviceptr dst, std::size_t bytes, const Stream& s) {
  TIDE_CU(cuMemsetD8Async, dst, 0, bytes, s.get());
}

void copy_to_host_async(void* dst, CUdeviceptr src, std::size_t bytes, const Stream& s) {
  TIDE_CU(cuMemcpyDtoHAsync, dst, src, bytes, s.get());
}

void copy_on_device_async(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, const Stream& s) {
  TIDE_CU(cuMemcpyDtoDAsync, dst, src, bytes, s.get());
}

void copy_to_device(CUdeviceptr dst, const void* src, std::size_t bytes) {
  TIDE_CU(cuMemcpyHtoD, dst, src, bytes);
}

void copy_to_host(void* dst, CUdeviceptr src, std::size_t bytes) {
  TIDE_CU(cuMemcpyDtoH, dst, src, bytes);
}

bool host_addressable(CUdeviceptr ptr) {
  if (cuda().cuPointerGetAttribute == nullptr) return false;
  unsigned type = 0;
  const CUresult r = cuda().cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr);
  if (r == CUDA_ERROR_INVALID_VALUE) return true;  // not the driver's: ordinary host memory
  return r == CUDA_SUCCESS && type == CU_MEMORYTYPE_HOST;
}

}  // namespace tide::driver
