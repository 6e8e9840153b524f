// A bad TIDE_STANDIN_* value (set by tests/standin/CMakeLists.txt): cuInit fails with
// CUDA_ERROR_INVALID_VALUE and says why on stderr, once; the driver stays uninitialised.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/standin/standin_test.h"

namespace tide::standin::test {
namespace {

// What `fn` writes to file descriptor 2.
template <typename F>
std::string stderr_of(F&& fn) {
  std::fflush(stderr);
  char path[] = "/tmp/tide-standin-stderr-XXXXXX";
  const int file = mkstemp(path);
  if (file < 0) return "mkstemp failed";
  unlink(path);
  const int saved = dup(2);
  dup2(file, 2);
  fn();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::string text;
  lseek(file, 0, SEEK_SET);
  char buffer[4096];
  for (ssize_t n; (n = read(file, buffer, sizeof buffer)) > 0;) {
    text.append(buffer, static_cast<std::size_t>(n));
  }
  close(file);
  return text;
}

std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(EnvInvalid, CuInitFailsOnceLoudlyThenQuietly) {
  const char* variable = std::getenv("STANDIN_TEST_BAD_VARIABLE");
  ASSERT_NE(variable, nullptr);
  // Before cuInit: not initialised, the control API included.
  int count = 0;
  EXPECT_EQ(cuDeviceGetCount(&count), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(tide_standin_fail_alloc(1), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(tide_standin_set_bandwidth(1, 1), CUDA_ERROR_NOT_INITIALIZED);

  const std::string text = stderr_of([] {
    EXPECT_EQ(cuInit(0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cuInit(0), CUDA_ERROR_INVALID_VALUE);
  });
  EXPECT_EQ(occurrences(text, "tide stand-in driver: "), 1u) << text;
  EXPECT_EQ(occurrences(text, std::string(variable) + "=\""), 1u) << text;
  EXPECT_NE(text.find("is not valid"), std::string::npos) << text;

  EXPECT_EQ(cuDeviceGetCount(&count), CUDA_ERROR_NOT_INITIALIZED);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc(&p, 16), CUDA_ERROR_NOT_INITIALIZED);
  int version = 0;
  EXPECT_EQ(cuDriverGetVersion(&version), CUDA_SUCCESS);  // works without cuInit
  const char* name = nullptr;
  EXPECT_EQ(cuGetErrorName(CUDA_ERROR_NOT_INITIALIZED, &name), CUDA_SUCCESS);
}

}  // namespace
}  // namespace tide::standin::test
