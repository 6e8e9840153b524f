// What happens when there is no usable CUDA driver: one clear message, never a crash.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <filesystem>
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
  // Where the stand-in is, as a path that exists (this build has one beside libtide.so).
  const std::string name = "/libtide_standin_cuda.so";
  const auto at = message.find(name);
  ASSERT_NE(at, std::string::npos) << message;
  const auto start = message.rfind(' ', at) + 1;
  EXPECT_TRUE(std::filesystem::exists(message.substr(start, at + name.size() - start))) << message;
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
