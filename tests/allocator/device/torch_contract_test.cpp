// PyTorch's side of the pluggable-allocator contract, played by a stand-in consumer: libtide.so
// is dlopen()ed as a library of its own (as torch.cuda.memory.CUDAPluggableAllocator loads it),
// and its allocate function is called through a std::function, as
// CUDAPluggableAllocator::malloc calls it (PyTorch 2.15). Out of memory must arrive as a C++
// exception that crosses the library boundary, with the allocator's state in its message, and
// leave the allocator able to go on; never as a NULL data pointer. The C function tide_alloc
// keeps returning NULL, for C callers. tests/python/test_allocator_oom.py checks the same with
// PyTorch on a real GPU.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>

#include "tide/tide.h"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

class TorchContractTest : public ::testing::Test {
 protected:
  void SetUp() override {
    handle_ = dlopen(TIDE_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
  }
  void TearDown() override {
    // Not dlclose()d: tide's driver and allocators live until the process ends.
  }
  template <typename F>
  F* symbol(const char* name) {
    void* s = dlsym(handle_, name);
    EXPECT_NE(s, nullptr) << name;
    return reinterpret_cast<F*>(s);
  }

  void* handle_ = nullptr;
};

std::uint64_t allocated_now(tide_status (*get_stats)(int, tide_alloc_stats*)) {
  tide_alloc_stats s = tide_alloc_stats_default();
  EXPECT_EQ(get_stats(0, &s), TIDE_OK);
  return s.allocated_bytes[0].current;
}

// TIDE_ALLOC_MAX_BYTES=64MiB (tests/allocator/device/CMakeLists.txt).
TEST_F(TorchContractTest, OutOfMemoryThrowsWithTheAllocatorsStateAndTheAllocatorGoesOn) {
  const std::function<void*(std::size_t, int, void*)> allocate =
      symbol<void*(std::size_t, int, void*)>("tide_alloc_throwing");
  const std::function<void(void*, std::size_t, int, void*)> release =
      symbol<void(void*, std::size_t, int, void*)>("tide_free");
  auto* get_stats = symbol<tide_status(int, tide_alloc_stats*)>("tide_alloc_get_stats");
  ASSERT_TRUE(allocate && release && get_stats);

  void* held = allocate(16 * kMiB, 0, nullptr);
  ASSERT_NE(held, nullptr);
  std::string message;
  try {
    void* never = allocate(1024 * kMiB, 0, nullptr);
    ADD_FAILURE() << "out of memory returned " << never;
  } catch (const std::exception& e) {
    message = e.what();
  }
  EXPECT_EQ(message.rfind("CUDA out of memory. tide: out of memory on device 0: asked for "
                          "1.00 GiB",
                          0),
            0u)
      << message;
  EXPECT_NE(message.find("16.0 MiB live"), std::string::npos) << message;
  EXPECT_NE(message.find("reserved of a limit of 64.0 MiB (the limit refused it"),
            std::string::npos)
      << message;
  EXPECT_EQ(allocated_now(get_stats), 16 * kMiB);

  // Training goes on: what fits is allocated, and everything is given back.
  void* more = allocate(32 * kMiB, 0, nullptr);
  ASSERT_NE(more, nullptr);
  release(more, 32 * kMiB, 0, nullptr);
  release(held, 16 * kMiB, 0, nullptr);
  EXPECT_EQ(allocated_now(get_stats), 0u);
  EXPECT_EQ(allocate(0, 0, nullptr), nullptr) << "an empty tensor has no memory, and no error";
}

TEST_F(TorchContractTest, TheCFunctionReturnsNullAndSaysWhy) {
  auto* allocate = symbol<void*(std::size_t, int, void*)>("tide_alloc");
  auto* last_error = symbol<const char*()>("tide_last_error");
  ASSERT_TRUE(allocate && last_error);
  EXPECT_EQ(allocate(1024 * kMiB, 0, nullptr), nullptr);
  EXPECT_EQ(std::string(last_error()).rfind("tide: out of memory on device 0: asked for", 0), 0u)
      << last_error();
}

TEST_F(TorchContractTest, ADriverFailureThrowsItsMessageToo) {
  const std::function<void*(std::size_t, int, void*)> allocate =
      symbol<void*(std::size_t, int, void*)>("tide_alloc_throwing");
  try {
    void* never = allocate(kMiB, 99, nullptr);  // no device 99
    ADD_FAILURE() << "returned " << never;
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("99"), std::string::npos) << e.what();
  }
}

}  // namespace
