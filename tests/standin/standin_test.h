// Shared by the stand-in driver's tests: they link libtide_standin_cuda.so and call it directly.
#pragma once

#include <cuda.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <ostream>
#include <vector>

#include "standin/standin.h"

// gtest prints CUresults by name.
inline void PrintTo(CUresult result, std::ostream* os) {
  const char* name = nullptr;
  if (cuGetErrorName(result, &name) == CUDA_SUCCESS && name != nullptr) {
    *os << name;
  } else {
    *os << "CUresult(" << static_cast<int>(result) << ")";
  }
}

namespace tide::standin::test {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Each test runs in a fresh primary context of device 0, current on the test's thread; the
// context is destroyed (its last release) when the test ends, so nothing leaks between tests.
class StandinTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&context_, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSetCurrent(context_), CUDA_SUCCESS);
    ASSERT_EQ(tide_standin_set_bandwidth(0, 0), 0);
  }
  void TearDown() override {
    tide_standin_set_bandwidth(0, 0);
    tide_standin_fail_alloc(0);
    tide_standin_fail_copy(0);
    tide_standin_device_lost(0);
    EXPECT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    EXPECT_EQ(cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  }

  static tide_standin_stats stats() {
    tide_standin_stats s{};
    tide_standin_get_stats(&s);
    return s;
  }

  CUcontext context_ = nullptr;
};

// A device buffer freed at scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cuMemAlloc(&ptr_, bytes), CUDA_SUCCESS);
  }
  ~DeviceBuffer() {
    if (ptr_ != 0) cuMemFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  CUdeviceptr get() const { return ptr_; }
  std::size_t size() const { return bytes_; }

 private:
  CUdeviceptr ptr_ = 0;
  std::size_t bytes_;
};

// A stream destroyed at scope exit.
class Stream {
 public:
  explicit Stream(unsigned flags = CU_STREAM_NON_BLOCKING) {
    EXPECT_EQ(cuStreamCreate(&stream_, flags), CUDA_SUCCESS);
  }
  ~Stream() {
    if (stream_ != nullptr) cuStreamDestroy(stream_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  CUstream get() const { return stream_; }

 private:
  CUstream stream_ = nullptr;
};

// An event destroyed at scope exit.
class Event {
 public:
  explicit Event(unsigned flags = CU_EVENT_DEFAULT) {
    EXPECT_EQ(cuEventCreate(&event_, flags), CUDA_SUCCESS);
  }
  ~Event() {
    if (event_ != nullptr) cuEventDestroy(event_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  CUevent get() const { return event_; }

 private:
  CUevent event_ = nullptr;
};

// Host memory registered with the driver for the object's life.
class PinnedVector {
 public:
  explicit PinnedVector(std::size_t bytes, std::uint8_t fill = 0) : data_(bytes, fill) {
    EXPECT_EQ(cuMemHostRegister(data_.data(), data_.size(), 0), CUDA_SUCCESS);
  }
  ~PinnedVector() { cuMemHostUnregister(data_.data()); }
  PinnedVector(const PinnedVector&) = delete;
  PinnedVector& operator=(const PinnedVector&) = delete;
  std::uint8_t* data() { return data_.data(); }
  std::size_t size() const { return data_.size(); }
  std::vector<std::uint8_t>& vector() { return data_; }

 private:
  std::vector<std::uint8_t> data_;
};

}  // namespace tide::standin::test
