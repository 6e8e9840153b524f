// The stand-in driver's control API, for the device allocator's tests: the test process loads the
// same library the driver layer loaded (TIDE_CUDA_DRIVER), so both see one stand-in.
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "standin/standin.h"

namespace tide::allocator::testing {

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
  void fail_alloc(std::uint64_t n) const { check(fail_alloc_(n), "tide_standin_fail_alloc"); }

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
};

}  // namespace tide::allocator::testing
