// The driver layer against the host stand-in driver (TIDE_CUDA_DRIVER is set by the test).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "driver/context.h"
#include "driver/cuda_api.h"
#include "driver/error.h"
#include "driver/memory.h"
#include "driver/module.h"
#include "driver/stream.h"
#include "driver/virtual_memory.h"
#include "kernels/cast.h"
#include "kernels/fatbin.h"

namespace tide::driver {
namespace {

class DriverTest : public ::testing::Test {
 protected:
  CurrentContext context_{0};
};

TEST_F(DriverTest, LoadsTheDriverNamedByTheEnvironment) {
  const CudaApi& api = cuda();
  EXPECT_EQ(api.library, std::getenv("TIDE_CUDA_DRIVER"));
  EXPECT_GE(api.version, 12000);
  EXPECT_GE(device_count(), 1);
  EXPECT_FALSE(device_name(0).empty());
  const MemoryInfo info = memory_info();
  EXPECT_GT(info.total_bytes, 0u);
  EXPECT_LE(info.free_bytes, info.total_bytes);
}

TEST_F(DriverTest, FailedCallNamesTheCallTheErrorAndItsText) {
  try {
    TIDE_CU(cuMemFree, CUdeviceptr{0xdead0000});
    FAIL() << "cuMemFree of a bogus pointer succeeded";
  } catch (const CudaError& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.call(), "cuMemFree");
    EXPECT_EQ(message.rfind("cuMemFree failed: CUDA_ERROR_", 0), 0u) << message;
    EXPECT_NE(message.find(" ("), std::string::npos) << message;  // the driver's text
  }
}

TEST_F(DriverTest, OutOfMemoryIsACudaErrorWithItsCode) {
  const MemoryInfo info = memory_info();
  try {
    DeviceBuffer too_big(info.total_bytes + (1u << 20));
    FAIL() << "allocated more than the device has";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.result(), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(e.call(), "cuMemAlloc");
  }
}

TEST_F(DriverTest, CopiesRoundTripThroughDeviceMemoryOnStreams) {
  std::mt19937 rng(std::random_device{}());
  std::vector<std::uint32_t> in(1 << 16);
  for (auto& v : in) v = static_cast<std::uint32_t>(rng());
  std::vector<std::uint32_t> out(in.size(), 0);
  const std::size_t bytes = in.size() * sizeof(std::uint32_t);

  HostRegistration pin_in(in.data(), bytes);
  HostRegistration pin_out(out.data(), bytes);
  DeviceBuffer a(bytes);
  DeviceBuffer b(bytes);
  Stream up;
  Stream down;
  Event uploaded;
  copy_to_device_async(a.get(), in.data(), bytes, up);
  copy_on_device_async(b.get(), a.get(), bytes, up);
  uploaded.record(up);
  down.wait(uploaded);  // the download must see the upload's bytes
  copy_to_host_async(out.data(), b.get(), bytes, down);
  down.synchronize();
  EXPECT_TRUE(down.idle());
  EXPECT_TRUE(uploaded.done());
  EXPECT_EQ(in, out);
}

TEST_F(DriverTest, HostCallbackRunsAfterPriorWork) {
  std::vector<std::uint8_t> host(4096, 7);
  std::vector<std::uint8_t> seen;
  DeviceBuffer buffer(host.size());
  Stream stream;
  copy_to_device_async(buffer.get(), host.data(), host.size(), stream);
  std::vector<std::uint8_t> back(host.size());
  copy_to_host_async(back.data(), buffer.get(), back.size(), stream);
  stream.host_callback([&] { seen = back; });
  stream.synchronize();
  EXPECT_EQ(seen, host);
}

TEST_F(DriverTest, TimingEventsMeasureElapsedTime) {
  Stream stream;
  Event start(Event::Timing::kEnabled);
  Event stop(Event::Timing::kEnabled);
  start.record(stream);
  stop.record(stream);
  stop.synchronize();
  EXPECT_GE(stop.elapsed_ms(start), 0.0f);
}

TEST_F(DriverTest, VirtualMemoryMapsPhysicalMemoryIntoAReservedRange) {
  ASSERT_TRUE(has_virtual_memory());
  const std::size_t granularity = allocation_granularity(0);
  ASSERT_GT(granularity, 0u);
  AddressRange range(4 * granularity);
  PhysicalMemory first(granularity, 0);
  PhysicalMemory second(granularity, 0);
  map(range.get(), first, 0);
  map(range.get() + granularity, second, 0);
  // The two pieces form one contiguous device range.
  std::vector<std::uint8_t> in(2 * granularity);
  std::iota(in.begin(), in.end(), std::uint8_t{1});
  copy_to_device(range.get(), in.data(), in.size());
  std::vector<std::uint8_t> out(in.size());
  copy_to_host(out.data(), range.get(), out.size());
  EXPECT_EQ(in, out);
  unmap(range.get(), granularity);
  unmap(range.get() + granularity, granularity);
}

TEST_F(DriverTest, VirtualMemoryRejectsUnalignedSizes) {
  const std::size_t granularity = allocation_granularity(0);
  EXPECT_THROW(PhysicalMemory(granularity + 1, 0), CudaError);
}

TEST_F(DriverTest, EmbeddedKernelRunsThroughTheDriver) {
  ASSERT_GT(kernels::fatbin_size(), 0u);
  Module module(kernels::fatbin_image());
  const CUfunction cast = module.function(kernels::kCastKernel);
  EXPECT_THROW(module.function("no_such_kernel"), CudaError);

  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 100.0f);
  const std::size_t count = 10007;
  std::vector<float> values(count);
  for (auto& v : values) v = normal(rng);
  DeviceBuffer src(count * sizeof(float));
  DeviceBuffer dst(count * sizeof(std::uint16_t));
  copy_to_device(src.get(), values.data(), count * sizeof(float));
  Stream stream;
  for (auto dtype : {kernels::Dtype::kBFloat16, kernels::Dtype::kFloat16}) {
    kernels::CastParams params{src.get(), dst.get(), count, dtype};
    launch(cast, LaunchShape{.grid_x = 40, .block_x = 256}, stream, params);
    params.count = 0;  // the launch copied the parameters: changing them now changes nothing
    stream.synchronize();
    std::vector<std::uint16_t> out(count);
    copy_to_host(out.data(), dst.get(), count * sizeof(std::uint16_t));
    for (std::size_t i = 0; i < count; ++i) {
      ASSERT_EQ(out[i], kernels::cast_element(values[i], dtype)) << i;
    }
  }
}

}  // namespace
}  // namespace tide::driver
