// The host stand-in driver as the allocator's and the executor's tests control and observe it:
// its counters, capacity, bandwidth and fault injection (standin/standin.h), and what it knows of
// registered host memory, asked as a program asks a real driver (cuPointerGetAttribute). The test
// process loads the same library the driver layer loaded (TIDE_CUDA_DRIVER), so both see one
// stand-in.
#pragma once

#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

#include "standin/standin.h"

namespace tide::allocator::testing {

// An address range [base, base + size).
struct Range {
  std::uintptr_t base;
  std::size_t size;
  bool holds(const void* p, std::size_t bytes) const {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    return a >= base && bytes <= size && a - base <= size - bytes;
  }
};

class DeviceStandin {
 public:
  DeviceStandin() {
    const char* path = std::getenv("TIDE_CUDA_DRIVER");
    if (path == nullptr) throw std::runtime_error("TIDE_CUDA_DRIVER is not set");
    handle_ = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) throw std::runtime_error(std::string("dlopen: ") + dlerror());
    load(get_stats_, "tide_standin_get_stats");
    load(reset_stats_, "tide_standin_reset_stats");
    load(set_bandwidth_, "tide_standin_set_bandwidth");
    load(set_capacity_, "tide_standin_set_capacity");
    load(device_memory_, "tide_standin_device_memory");
    load(fail_alloc_, "tide_standin_fail_alloc");
    load(fail_copy_, "tide_standin_fail_copy");
    load(device_lost_, "tide_standin_device_lost");
    load(fail_pin_, "tide_standin_fail_pin");
    load(fail_launch_, "tide_standin_fail_launch");
    load(set_hmm_, "tide_standin_set_hmm");
    load(pointer_attribute_, "cuPointerGetAttribute");
  }
  ~DeviceStandin() { dlclose(handle_); }
  DeviceStandin(const DeviceStandin&) = delete;
  DeviceStandin& operator=(const DeviceStandin&) = delete;

  tide_standin_stats stats() const {
    tide_standin_stats s{};
    get_stats_(&s);
    return s;
  }
  void reset_stats() const { reset_stats_(); }
  // Driver allocation calls so far: cuMemAlloc and cuMemCreate.
  std::uint64_t device_allocations() const {
    const tide_standin_stats s = stats();
    return s.device_allocs + s.mem_creates;
  }
  std::uint64_t bytes_in_use(int device = 0) const {
    std::uint64_t used = 0;
    check(device_memory_(device, &used, nullptr, nullptr), "tide_standin_device_memory");
    return used;
  }
  std::uint64_t capacity(int device = 0) const {
    std::uint64_t capacity = 0;
    check(device_memory_(device, nullptr, nullptr, &capacity), "tide_standin_device_memory");
    return capacity;
  }
  void set_capacity(std::uint64_t bytes, int device = 0) const {
    check(set_capacity_(device, bytes), "tide_standin_set_capacity");
  }
  void set_bandwidth(double h2d_gbps, double d2h_gbps) const {
    check(set_bandwidth_(h2d_gbps, d2h_gbps), "tide_standin_set_bandwidth");
  }
  // Fault injection: the nth device allocation, the nth copy, the nth kernel launch, every driver
  // call from the nth on (device lost) fail; 0 ends it.
  void fail_alloc(std::uint64_t n) const { check(fail_alloc_(n), "tide_standin_fail_alloc"); }
  void fail_copy(std::uint64_t n) const { check(fail_copy_(n), "tide_standin_fail_copy"); }
  void device_lost(std::uint64_t n) const { check(device_lost_(n), "tide_standin_device_lost"); }
  void fail_pin(std::uint64_t n) const { check(fail_pin_(n), "tide_standin_fail_pin"); }
  void fail_launch(std::uint64_t n) const { check(fail_launch_(n), "tide_standin_fail_launch"); }
  // Devices address pageable host memory (HMM), as tide's CPU mode needs.
  void hmm(bool on) const { check(set_hmm_(on ? 1 : 0), "tide_standin_set_hmm"); }

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

 private:
  template <typename F>
  void load(F& fn, const char* name) {
    fn = reinterpret_cast<F>(dlsym(handle_, name));
    if (fn == nullptr) throw std::runtime_error(std::string("not the stand-in driver: no ") + name);
  }
  static void check(int r, const char* what) {
    if (r != 0) throw std::runtime_error(std::string(what) + " failed: " + std::to_string(r));
  }

  void* handle_ = nullptr;
  void (*get_stats_)(tide_standin_stats*) = nullptr;
  void (*reset_stats_)() = nullptr;
  int (*set_bandwidth_)(double, double) = nullptr;
  int (*set_capacity_)(int, std::uint64_t) = nullptr;
  int (*device_memory_)(int, std::uint64_t*, std::uint64_t*, std::uint64_t*) = nullptr;
  int (*fail_alloc_)(std::uint64_t) = nullptr;
  int (*fail_copy_)(std::uint64_t) = nullptr;
  int (*device_lost_)(std::uint64_t) = nullptr;
  int (*fail_pin_)(std::uint64_t) = nullptr;
  int (*fail_launch_)(std::uint64_t) = nullptr;
  int (*set_hmm_)(int) = nullptr;
  CUresult (*pointer_attribute_)(void*, CUpointer_attribute, CUdeviceptr) = nullptr;
};

}  // namespace tide::allocator::testing
