// A process that never uses CUDA runs under the preload exactly as without it: no knob is read
// (ctest sets an invalid TIDE_MEMORY_LIMIT), no thread or signal handler appears, nothing is
// written at exit, and dlsym keeps glibc's answers.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "preload_test_support.h"

namespace tide::interpose::test {
namespace {

int threads_in_process() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task")) {
    ++count;
  }
  return count;
}

TEST(Inert, NothingHappensWithoutCuda) {
  ASSERT_TRUE(preloaded());
  tide_interpose_stats s{};
  using Read = int (*)(int, tide_interpose_stats*);
  auto read = reinterpret_cast<Read>(dlsym(RTLD_DEFAULT, "tide_interpose_read_stats"));
  ASSERT_NE(read, nullptr);
  EXPECT_EQ(read(0, &s), -1) << "the interposer has not started";
  // Ordinary lookups are glibc's.
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "strlen"), reinterpret_cast<void*>(&strlen));
  void* handle = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr);
  EXPECT_NE(dlsym(handle, "cos"), nullptr);
  EXPECT_EQ(dlsym(handle, "cuMemAlloc_v2"), nullptr) << "a hooked name libm does not have";
  dlclose(handle);
  // No driver loaded: probing for one finds nothing, although the preload exports these names.
  for (const char* name : {"cuGetProcAddress_v2", "cuMemAlloc_v2", "cudaMalloc"}) {
    dlerror();
    EXPECT_EQ(dlsym(RTLD_DEFAULT, name), nullptr) << name;
    EXPECT_NE(dlerror(), nullptr) << name;
  }
  EXPECT_EQ(read(0, &s), -1) << "still not started";
  EXPECT_EQ(threads_in_process(), 1);
  struct sigaction term {};
  ASSERT_EQ(sigaction(SIGTERM, nullptr, &term), 0);
  EXPECT_EQ(term.sa_handler, SIG_DFL);
}

TEST(Inert, NoReportAtExit) {
  const char* pattern = std::getenv("TIDE_REPORT");
  ASSERT_NE(pattern, nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) std::exit(0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  std::string path = pattern;
  path.replace(path.find("%p"), 2, std::to_string(pid));
  EXPECT_FALSE(std::filesystem::exists(path)) << path;
}

}  // namespace
}  // namespace tide::interpose::test
