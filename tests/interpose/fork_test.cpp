// fork() while other threads allocate through the hooks (as a data loader forks workers while
// the trainer runs): no deadlock, the child starts with none of the parent's device memory,
// writes a report only if it uses CUDA itself, and the parent's numbers are untouched.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "preload_test_support.h"

namespace tide::interpose::test {
namespace {

using MemAlloc = CUresult (*)(CUdeviceptr*, size_t);
using MemFree = CUresult (*)(CUdeviceptr);

bool exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

TEST(Fork, WhileThreadsAllocateTheChildIsCleanAndThereIsNoDeadlock) {
#if defined(__SANITIZE_ADDRESS__)
  // GCC 12's AddressSanitizer does not lock its own allocator around fork(): a child forked while
  // another thread is inside operator new can block forever on ASan's size-class mutex (seen:
  // the child stuck in SizeClassAllocator64::GetFromAllocator). glibc's malloc has fork
  // handlers, so the release and TSan builds run this test; under ASan it would only test ASan.
  GTEST_SKIP() << "ASan's allocator is not fork-safe with allocating threads (GCC 12)";
#endif
  expect_setup();
  auto alloc = reinterpret_cast<MemAlloc>(dlsym(fake_driver().handle, "cuMemAlloc_v2"));
  auto release = reinterpret_cast<MemFree>(dlsym(fake_driver().handle, "cuMemFree_v2"));
  const char* report_dir = std::getenv("TIDE_TEST_OUTPUT");
  ASSERT_NE(report_dir, nullptr);
  // Earlier runs' parents wrote their reports at exit (this run's will too): a child given one
  // of their process ids would find a report it never wrote (seen about once in 70 runs).
  for (const auto& entry : std::filesystem::directory_iterator(report_dir)) {
    if (entry.path().filename().string().starts_with("fork-")) std::filesystem::remove(entry);
  }

  CUdeviceptr held = 0;
  ASSERT_EQ(alloc(&held, 8 << 20), CUDA_SUCCESS);  // the parent's, live across every fork

  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      while (!stop.load()) {
        CUdeviceptr ptr = 0;
        if (alloc(&ptr, 4096) != CUDA_SUCCESS || release(ptr) != CUDA_SUCCESS) ++failures;
      }
    });
  }

  for (int round = 0; round < 12; ++round) {
    const bool child_uses_cuda = round % 2 == 0;
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // The child: none of the parent's memory, its own accounting if it allocates.
      int code = 0;
      if (stats().live_bytes != 0 || stats().allocations != 0) code = 10;
      if (child_uses_cuda) {
        CUdeviceptr ptr = 0;
        if (alloc(&ptr, 1 << 20) != CUDA_SUCCESS) code = 11;
        if (stats().live_bytes != (1 << 20)) code = 12;
        if (release(ptr) != CUDA_SUCCESS) code = 13;
      }
      std::exit(code);  // exit, not _exit: the at-exit report runs (or not)
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "round " << round;
    const std::string report = std::string(report_dir) + "/fork-" + std::to_string(pid) + ".json";
    EXPECT_EQ(exists(report), child_uses_cuda) << report;
    std::remove(report.c_str());
    std::remove((std::string(report_dir) + "/fork-" + std::to_string(pid) + ".trace.json").c_str());
  }
  stop = true;
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GE(stats().live_bytes, 8u << 20) << "the parent's numbers are its own";
  EXPECT_EQ(release(held), CUDA_SUCCESS);
}

}  // namespace
}  // namespace tide::interpose::test
