// Shared by the interposer's tests: they run under LD_PRELOAD=libtide_preload.so (set by ctest)
// with the stand-in driver (fakecuda/libcuda.so.1) on LD_LIBRARY_PATH.
#pragma once

#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "interpose/preload_api.h"

namespace tide::interpose::test {

// Whether `fn` lives in libtide_preload.so, i.e. is one of its hooks.
inline bool in_preload(const void* fn) {
  Dl_info info{};
  return fn != nullptr && dladdr(fn, &info) != 0 && info.dli_fname != nullptr &&
         std::string(info.dli_fname).find("libtide_preload") != std::string::npos;
}

inline bool preloaded() { return dlsym(RTLD_DEFAULT, "tide_interpose_read_stats") != nullptr; }

// The interposer's numbers for `device` (all zero when it has not started).
inline tide_interpose_stats stats(int device = 0) {
  using Read = int (*)(int, tide_interpose_stats*);
  auto read = reinterpret_cast<Read>(dlsym(RTLD_DEFAULT, "tide_interpose_read_stats"));
  tide_interpose_stats s{};
  if (read != nullptr) read(device, &s);
  return s;
}

inline int mark_phase(const char* phase) {
  using Mark = int (*)(const char*);
  auto mark = reinterpret_cast<Mark>(dlsym(RTLD_DEFAULT, "tide_interpose_mark_phase"));
  return mark != nullptr ? mark(phase) : -2;
}

// The stand-in driver, opened as the CUDA runtime opens libcuda.so.1: a local handle.
struct FakeDriver {
  void* handle = nullptr;
  const char* (*last_call)() = nullptr;
  void* (*function)(const char*) = nullptr;  // an export's real address, bypassing dlsym
  void (*set_device)(int) = nullptr;
  CUresult (*get_proc)(const char*, void**, int, cuuint64_t,
                       CUdriverProcAddressQueryResult*) = nullptr;  // as dlsym returns it

  template <typename Fn>
  Fn real(const char* name) const {
    return reinterpret_cast<Fn>(function(name));
  }
};

inline FakeDriver& fake_driver() {
  static FakeDriver driver = [] {
    FakeDriver d;
    d.handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (d.handle == nullptr) return d;
    d.last_call = reinterpret_cast<const char* (*)()>(dlsym(d.handle, "fakecuda_last_call"));
    d.function = reinterpret_cast<void* (*)(const char*)>(dlsym(d.handle, "fakecuda_function"));
    d.set_device = reinterpret_cast<void (*)(int)>(dlsym(d.handle, "fakecuda_set_device"));
    d.get_proc = reinterpret_cast<decltype(d.get_proc)>(dlsym(d.handle, "cuGetProcAddress_v2"));
    return d;
  }();
  return driver;
}

// Checks the set-up every interposer test relies on.
inline void expect_setup() {
  ASSERT_TRUE(preloaded()) << "run under LD_PRELOAD=libtide_preload.so (ctest sets it)";
  ASSERT_NE(fake_driver().handle, nullptr)
      << "the stand-in libcuda.so.1 must be on LD_LIBRARY_PATH: " << dlerror();
  ASSERT_NE(fake_driver().function, nullptr);
  ASSERT_NE(fake_driver().get_proc, nullptr);
}

}  // namespace tide::interpose::test
