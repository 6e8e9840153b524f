// One GPU buffer of the update phase (a GPU subgroup's state in flight, the nonfinite counters,
// a kept gradient), from a DeviceMemoryResource and given back to it when the buffer goes.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

#include "allocator/memory_resource.h"

namespace tide::runtime {

class UpdateBuffer {
 public:
  UpdateBuffer() = default;
  // Throws std::bad_alloc when the resource has no memory (the executor falls back to the CPU);
  // other failures as the resource throws them. `stream`: where the buffer is first used.
  UpdateBuffer(allocator::DeviceMemoryResource& memory, std::size_t bytes, CUstream stream)
      : memory_(&memory), bytes_(bytes), stream_(stream) {
    void* p = memory.allocate(bytes, stream);
    if (p == nullptr) throw std::bad_alloc();
    ptr_ = reinterpret_cast<CUdeviceptr>(p);
  }
  ~UpdateBuffer() { reset(); }
  UpdateBuffer(UpdateBuffer&& other) noexcept { *this = std::move(other); }
  UpdateBuffer& operator=(UpdateBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      memory_ = std::exchange(other.memory_, nullptr);
      ptr_ = std::exchange(other.ptr_, 0);
      bytes_ = std::exchange(other.bytes_, 0);
      stream_ = std::exchange(other.stream_, nullptr);
    }
    return *this;
  }
  UpdateBuffer(const UpdateBuffer&) = delete;
  UpdateBuffer& operator=(const UpdateBuffer&) = delete;

  CUdeviceptr get() const { return ptr_; }
  std::size_t size() const { return bytes_; }
  // Forgets the memory without freeing it: queued work that could not be waited for may still
  // use it.
  void leak() noexcept { ptr_ = 0; }

 private:
  // The executor frees its buffers only once the phase's streams are done with them, so the
  // stream order of the free is already satisfied. A free that fails (a lost device) leaves the
  // memory where it is.
  void reset() noexcept {
    if (ptr_ != 0) {
      try {
        memory_->deallocate(reinterpret_cast<void*>(ptr_), bytes_, stream_);
      } catch (...) {
      }
    }
    ptr_ = 0;
  }

  allocator::DeviceMemoryResource* memory_ = nullptr;
  CUdeviceptr ptr_ = 0;
  std::size_t bytes_ = 0;
  CUstream stream_ = nullptr;
};

}  // namespace tide::runtime
