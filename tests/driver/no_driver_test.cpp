// What happens when there is no usable CUDA driver: one clear message, never a crash.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "driver/cuda_api.h"
#include "driver/error.h"

namespace tide::driver {
namespace {

std::string load_error(const std::string& library) {
  try {
    load_driver(library);
  } catch (const DriverNotFound& e) {
    return e.what();
  }
  return "";
}

TEST(NoDriver, DefaultLibraryMissingNamesItAndTheOverride) {
  if (void* real = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    dlclose(real);
    GTEST_SKIP() << "a CUDA driver is installed on this machine";
  }
  const std::string message = load_error("libcuda.so.1");
  EXPECT_NE(message.find("libcuda.so.1"), std::string::npos) << message;
  EXPECT_NE(message.find("TIDE_CUDA_DRIVER"), std::string::npos) << message;
  EXPECT_NE(message.find("stand-in"), std::string::npos) << message;
}

TEST(NoDriver, MissingPathIsNamed) {
  const std::string message = load_error("/nonexistent/libcuda.so.1");
  EXPECT_NE(message.find("/nonexistent/libcuda.so.1"), std::string::npos) << message;
  EXPECT_NE(message.find("TIDE_CUDA_DRIVER"), std::string::npos) << message;
}

TEST(NoDriver, LibraryThatIsNotADriverIsRejected) {
  const std::string message = load_error("libm.so.6");
  EXPECT_NE(message.find("libm.so.6"), std::string::npos) << message;
  EXPECT_NE(message.find("has no cuInit"), std::string::npos) << message;
}

TEST(NoDriver, ProcessDriverFailsCleanlyAndRetries) {
  setenv("TIDE_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
  EXPECT_THROW(cuda(), DriverNotFound);
  EXPECT_THROW(cuda(), DriverNotFound);  // a failed load is retried, not cached
  unsetenv("TIDE_CUDA_DRIVER");
}

}  // namespace
}  // namespace tide::driver
