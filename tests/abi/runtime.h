// The CUDA runtime's part in a PyTorch process, played on the host stand-in driver around tide's
// calls: what tide shares the driver with. It retains a device's primary context once, makes it
// current on the threads it serves (as cudaSetDevice does), keeps a stream and an event of its
// own, and frees its memory once an event says the work using it is done (as PyTorch's caching
// allocator does). After each tide call a test asks whether all of that still works.
#pragma once

#include <cuda.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "standin/standin.h"

namespace tide::abi::testing {

inline tide_standin_stats standin_stats() {
  tide_standin_stats s{};
  tide_standin_get_stats(&s);
  return s;
}

class Runtime {
 public:
  explicit Runtime(int device = 0) {
    EXPECT_EQ(cuInit(0), CUDA_SUCCESS);
    EXPECT_EQ(cuDeviceGet(&device_, device), CUDA_SUCCESS);
    EXPECT_EQ(cuDevicePrimaryCtxRetain(&context_, device_), CUDA_SUCCESS);
    enter();
    EXPECT_EQ(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT_EQ(cuEventCreate(&event_, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  }
  ~Runtime() {
    const Pushed in(context_);
    for (CUdeviceptr p : memory_) EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
    EXPECT_EQ(cuEventDestroy(event_), CUDA_SUCCESS);
    EXPECT_EQ(cuStreamDestroy(stream_), CUDA_SUCCESS);
    EXPECT_EQ(cuDevicePrimaryCtxRelease(device_), CUDA_SUCCESS);
  }
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Serves the calling thread: its context becomes current there.
  void enter() const { EXPECT_EQ(cuCtxSetCurrent(context_), CUDA_SUCCESS); }
  CUcontext context() const { return context_; }
  CUstream stream() const { return stream_; }

  // Device memory of the runtime's (a tensor's), from any thread; freed with the runtime.
  CUdeviceptr allocate(std::size_t bytes, unsigned char fill) {
    const Pushed in(context_);
    CUdeviceptr p = 0;
    EXPECT_EQ(cuMemAlloc(&p, bytes), CUDA_SUCCESS);
    EXPECT_EQ(cuMemsetD8Async(p, fill, bytes, stream_), CUDA_SUCCESS);
    EXPECT_EQ(cuStreamSynchronize(stream_), CUDA_SUCCESS);
    memory_.push_back(p);
    return p;
  }

  // On the calling thread, after a tide call: its current context is `expected`, and where that
  // is the runtime's, work on the runtime's stream runs, its event records and completes, and
  // memory used there is freed once the event says so.
  ::testing::AssertionResult usable_here(CUcontext expected) const {
    CUcontext current = nullptr;
    if (CUresult r = cuCtxGetCurrent(&current); r != CUDA_SUCCESS) {
      return ::testing::AssertionFailure() << "cuCtxGetCurrent: " << r;
    }
    if (current != expected) {
      return ::testing::AssertionFailure()
             << "the thread's current context changed: " << current << " instead of " << expected;
    }
    if (expected != context_) return ::testing::AssertionSuccess();
    CUdeviceptr p = 0;
    const std::size_t bytes = 1 << 16;
    std::vector<unsigned char> back(bytes);
    CUresult r = cuMemAlloc(&p, bytes);
    if (r == CUDA_SUCCESS) r = cuMemsetD8Async(p, 0x5a, bytes, stream_);
    if (r == CUDA_SUCCESS) r = cuEventRecord(event_, stream_);
    if (r == CUDA_SUCCESS) {
      do {
        r = cuEventQuery(event_);  // as PyTorch's allocator asks before it reuses memory
      } while (r == CUDA_ERROR_NOT_READY);
    }
    if (r == CUDA_SUCCESS) r = cuMemcpyDtoH(back.data(), p, bytes);
    if (p != 0 && cuMemFree(p) != CUDA_SUCCESS && r == CUDA_SUCCESS) r = CUDA_ERROR_UNKNOWN;
    if (r != CUDA_SUCCESS) {
      return ::testing::AssertionFailure() << "the runtime's own work failed: " << r;
    }
    if (back.front() != 0x5a || back.back() != 0x5a) {
      return ::testing::AssertionFailure() << "the runtime's work wrote the wrong bytes";
    }
    return ::testing::AssertionSuccess();
  }

 private:
  // The runtime's context current for a scope, whatever the thread had.
  struct Pushed {
    explicit Pushed(CUcontext c) { EXPECT_EQ(cuCtxPushCurrent(c), CUDA_SUCCESS); }
    ~Pushed() { EXPECT_EQ(cuCtxPopCurrent(nullptr), CUDA_SUCCESS); }
    Pushed(const Pushed&) = delete;
    Pushed& operator=(const Pushed&) = delete;
  };

  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  CUstream stream_ = nullptr;
  CUevent event_ = nullptr;
  std::vector<CUdeviceptr> memory_;
};

}  // namespace tide::abi::testing
