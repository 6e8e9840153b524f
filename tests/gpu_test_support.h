// For tests built twice: against the host stand-in driver, and with TIDE_REAL_GPU defined
// (label `gpu`, tests/CMakeLists.txt) against the real CUDA driver. In the latter build,
// including this file makes the program exit 77, which ctest reports as skipped, when no driver
// loads or it reports no device: the test then says why on stderr instead of failing.
#pragma once

#if defined(TIDE_REAL_GPU)

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "driver/context.h"

namespace tide::testing {

class RequireGpu : public ::testing::Environment {
 public:
  void SetUp() override {
    try {
      if (driver::device_count() > 0) return;
      std::fprintf(stderr, "SKIP: the CUDA driver reports no device\n");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "SKIP: no CUDA driver: %s\n", e.what());
    }
    std::fflush(stderr);
    std::_Exit(77);
  }
};

inline ::testing::Environment* const kRequireGpu =
    ::testing::AddGlobalTestEnvironment(new RequireGpu);

}  // namespace tide::testing

#endif  // TIDE_REAL_GPU
