// What the host stand-in driver knows about registered host memory, asked the way a program asks
// a real driver (cuPointerGetAttribute) plus the stand-in's counters (tide_standin_get_stats).
// The test's process loads the same library the driver layer loads (TIDE_CUDA_DRIVER), so both see
// one registry.
#pragma once

#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

#include "standin/standin.h"

namespace tide::allocator::testing {

struct Range {
  std::uintptr_t base;
  std::size_t size;
  bool holds(const void* p, std::size_t bytes) const {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    return a >= base && bytes <= size && a - base <= size - bytes;
  }
};

class Standin {
 public:
  Standin() {
    const char* path = std::getenv("TIDE_CUDA_DRIVER");
    if (path == nullptr) throw std::runtime_error("TIDE_CUDA_DRIVER is not set");
    handle_ = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) throw std::runtime_error(std::string("dlopen: ") + dlerror());
    get_stats_ = reinterpret_cast<decltype(get_stats_)>(dlsym(handle_, "tide_standin_get_stats"));
    device_lost_ =
        reinterpret_cast<decltype(device_lost_)>(dlsym(handle_, "tide_standin_device_lost"));
    pointer_attribute_ =
        reinterpret_cast<decltype(pointer_attribute_)>(dlsym(handle_, "cuPointerGetAttribute"));
    if (get_stats_ == nullptr || device_lost_ == nullptr || pointer_attribute_ == nullptr) {
      throw std::runtime_error("TIDE_CUDA_DRIVER is not the stand-in driver");
    }
  }

  tide_standin_stats stats() const {
    tide_standin_stats s{};
    get_stats_(&s);
    return s;
  }

  // The registered range holding `p`, as the driver reports it.
  std::optional<Range> registered_range(const void* p) const {
    const auto ptr = reinterpret_cast<CUdeviceptr>(p);
    unsigned type = 0;
    if (pointer_attribute_(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr) != CUDA_SUCCESS ||
        type != CU_MEMORYTYPE_HOST) {
      return std::nullopt;
    }
    CUdeviceptr start = 0;
    std::size_t size = 0;
    if (pointer_attribute_(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr) != CUDA_SUCCESS ||
        pointer_attribute_(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr) != CUDA_SUCCESS) {
      return std::nullopt;
    }
    return Range{static_cast<std::uintptr_t>(start), size};
  }

  // Whether all of [p, p + bytes) lies in one registration.
  ::testing::AssertionResult registered(const void* p, std::size_t bytes) const {
    const auto range = registered_range(p);
    if (!range) return ::testing::AssertionFailure() << p << " is not in registered memory";
    if (!range->holds(p, bytes)) {
      return ::testing::AssertionFailure()
             << "[" << p << ", +" << bytes << ") is not inside one registration (range at "
             << reinterpret_cast<void*>(range->base) << ", " << range->size << " bytes)";
    }
    return ::testing::AssertionSuccess();
  }

  void device_lost(std::uint64_t n) const { device_lost_(n); }

 private:
  void* handle_ = nullptr;
  void (*get_stats_)(tide_standin_stats*) = nullptr;
  int (*device_lost_)(std::uint64_t) = nullptr;
  CUresult (*pointer_attribute_)(void*, CUpointer_attribute, CUdeviceptr) = nullptr;
};

}  // namespace tide::allocator::testing
