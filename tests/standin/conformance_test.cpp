// Where the stand-in follows CUDA's rules for the driver calls tide makes, one test per rule that
// an earlier stand-in did not keep (standin/README.md, "Differences from CUDA", lists every rule
// and its test). Two devices (TIDE_STANDIN_DEVICES=2, tests/standin/CMakeLists.txt).
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cast.h"
#include "tests/standin/standin_test.h"

namespace tide::standin::test {
namespace {

using ConformanceTest = StandinTest;

TEST_F(ConformanceTest, FreeingNothingIsNoError) {
  EXPECT_EQ(cuMemFree(0), CUDA_SUCCESS);  // as CUDA's cuMemFree(0)
  EXPECT_EQ(cuMemFree(0xdead0000), CUDA_ERROR_INVALID_VALUE);
}

struct HostCall {
  CUresult alloc = CUDA_SUCCESS;
  CUresult current = CUDA_SUCCESS;
};

void calls_the_driver(void* arg) {
  auto* call = static_cast<HostCall*>(arg);
  CUdeviceptr p = 0;
  call->alloc = cuMemAlloc(&p, 256);
  CUcontext context = nullptr;
  call->current = cuCtxGetCurrent(&context);
}

// CUDA: a host function "must not make any CUDA API calls"; they "may result in
// CUDA_ERROR_NOT_PERMITTED". Here they always do.
TEST_F(ConformanceTest, HostFunctionsMayNotCallTheDriver) {
  Stream stream;
  HostCall call;
  ASSERT_EQ(cuLaunchHostFunc(stream.get(), calls_the_driver, &call), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
  EXPECT_EQ(call.alloc, CUDA_ERROR_NOT_PERMITTED);
  EXPECT_EQ(call.current, CUDA_ERROR_NOT_PERMITTED);
  CUcontext context = nullptr;
  EXPECT_EQ(cuCtxGetCurrent(&context), CUDA_SUCCESS);  // the caller's thread is not affected
  EXPECT_EQ(context, context_);
}

// The second device's primary context, current while it lives; device 0's again after.
class OtherDevice {
 public:
  OtherDevice() {
    EXPECT_EQ(cuCtxGetCurrent(&previous_), CUDA_SUCCESS);
    EXPECT_EQ(cuDevicePrimaryCtxRetain(&context_, 1), CUDA_SUCCESS);
    EXPECT_EQ(cuCtxSetCurrent(context_), CUDA_SUCCESS);
  }
  ~OtherDevice() {
    cuCtxSetCurrent(previous_);
    cuDevicePrimaryCtxRelease(1);
  }
  OtherDevice(const OtherDevice&) = delete;
  OtherDevice& operator=(const OtherDevice&) = delete;

 private:
  CUcontext previous_ = nullptr;
  CUcontext context_ = nullptr;
};

// CUDA: "hEvent and hStream must be from the same context otherwise CUDA_ERROR_INVALID_HANDLE".
// Waiting on another context's event is fine.
TEST_F(ConformanceTest, AnEventIsRecordedOnlyOnAStreamOfItsContext) {
  Event event;  // device 0
  Stream here;
  EXPECT_EQ(cuEventRecord(event.get(), here.get()), CUDA_SUCCESS);
  const OtherDevice other;
  Stream there;  // device 1
  EXPECT_EQ(cuEventRecord(event.get(), there.get()), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuEventRecord(event.get(), nullptr), CUDA_ERROR_INVALID_HANDLE);  // device 1's
  EXPECT_EQ(cuStreamWaitEvent(there.get(), event.get(), 0), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamSynchronize(there.get()), CUDA_SUCCESS);
}

// What cuModuleGetFunction finds: the kernels the image names.
constexpr char kCastImage[] = "// PTX\n.version 8.0\n.entry tide_cast_f32_to_half(\n";

// A module's code is loaded in the context it was loaded in, and runs there only.
TEST_F(ConformanceTest, AKernelRunsOnlyInTheContextOfItsModule) {
  CUmodule module = nullptr;
  ASSERT_EQ(cuModuleLoadData(&module, kCastImage), CUDA_SUCCESS);
  CUfunction cast = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&cast, module, kernels::kCastKernel), CUDA_SUCCESS);
  DeviceBuffer src(64), dst(64);
  kernels::CastParams params{src.get(), dst.get(), 8, kernels::Dtype::kBFloat16};
  void* args[] = {&params};
  {
    const OtherDevice other;
    Stream there;
    EXPECT_EQ(cuLaunchKernel(cast, 1, 1, 1, 32, 1, 1, 0, there.get(), args, nullptr),
              CUDA_ERROR_INVALID_HANDLE);
  }
  EXPECT_EQ(cuLaunchKernel(cast, 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(cuModuleUnload(module), CUDA_SUCCESS);
}

// Above 48 KiB a kernel needs cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
// first, which the stand-in does not offer and tide never calls.
TEST_F(ConformanceTest, DynamicSharedMemoryAbove48KiBIsRefused) {
  CUmodule module = nullptr;
  ASSERT_EQ(cuModuleLoadData(&module, kCastImage), CUDA_SUCCESS);
  CUfunction cast = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&cast, module, kernels::kCastKernel), CUDA_SUCCESS);
  DeviceBuffer src(64), dst(64);
  kernels::CastParams params{src.get(), dst.get(), 8, kernels::Dtype::kFloat16};
  void* args[] = {&params};
  EXPECT_EQ(cuLaunchKernel(cast, 1, 1, 1, 32, 1, 1, 48 * 1024 + 1, nullptr, args, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuLaunchKernel(cast, 1, 1, 1, 32, 1, 1, 48 * 1024, nullptr, args, nullptr),
            CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(cuModuleUnload(module), CUDA_SUCCESS);
}

// A fatbin's header (magic, version, header size, payload size) and payload.
std::vector<unsigned char> fatbin(const std::string& payload, std::uint64_t claimed_size) {
  std::vector<unsigned char> image = {0x50, 0xed, 0x55, 0xba, 1, 0, 16, 0};
  for (int i = 0; i < 8; ++i) image.push_back(static_cast<unsigned char>(claimed_size >> (8 * i)));
  image.insert(image.end(), payload.begin(), payload.end());
  return image;
}

TEST_F(ConformanceTest, AModuleHasOnlyTheKernelsItsImageNames) {
  const std::string payload("\0.text.tide_cast_f32_to_half\0", 29);
  struct Case {
    std::vector<unsigned char> image;
    CUresult load;
    CUresult cast;  // cuModuleGetFunction of the cast kernel
  };
  auto text = [](const char* t) {
    return std::vector<unsigned char>(t, t + std::strlen(t) + 1);  // with its NUL
  };
  const Case cases[] = {
      {fatbin(payload, payload.size()), CUDA_SUCCESS, CUDA_SUCCESS},
      // The name past the size the header gives is not the module's.
      {fatbin(payload, 4), CUDA_SUCCESS, CUDA_ERROR_NOT_FOUND},
      {fatbin(payload, std::uint64_t{1} << 40), CUDA_ERROR_INVALID_IMAGE, CUDA_SUCCESS},
      {text(kCastImage), CUDA_SUCCESS, CUDA_SUCCESS},
      // A longer identifier is not the kernel.
      {text("// PTX\n.entry tide_cast_f32_to_half_v2(\n"), CUDA_SUCCESS, CUDA_ERROR_NOT_FOUND},
      {text("// PTX\n.entry another_kernel(\n"), CUDA_SUCCESS, CUDA_ERROR_NOT_FOUND},
      {text(""), CUDA_ERROR_INVALID_IMAGE, CUDA_SUCCESS},
  };
  for (std::size_t i = 0; i < std::size(cases); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const Case& c = cases[i];
    CUmodule module = nullptr;
    ASSERT_EQ(cuModuleLoadData(&module, c.image.data()), c.load);
    if (c.load != CUDA_SUCCESS) continue;
    CUfunction f = nullptr;
    EXPECT_EQ(cuModuleGetFunction(&f, module, kernels::kCastKernel), c.cast);
    EXPECT_EQ(cuModuleUnload(module), CUDA_SUCCESS);
  }
}

// CUDA promises 256-byte alignment: the stand-in gives that and no more, so that code assuming
// 512 bytes or a page fails here too.
TEST_F(ConformanceTest, AllocationsAreAlignedTo256BytesAndNoMore) {
  for (std::size_t bytes : {1, 256, 4096, 1 << 20}) {
    CUdeviceptr p = 0;
    ASSERT_EQ(cuMemAlloc(&p, bytes), CUDA_SUCCESS);
    EXPECT_EQ(p % 512, 256u) << bytes;
    std::vector<std::uint8_t> in(bytes, 7), out(bytes);
    ASSERT_EQ(cuMemcpyHtoD(p, in.data(), bytes), CUDA_SUCCESS);
    ASSERT_EQ(cuMemcpyDtoH(out.data(), p, bytes), CUDA_SUCCESS);
    EXPECT_EQ(in, out);
    ASSERT_EQ(cuMemFree(p), CUDA_SUCCESS);
  }
}

struct Gate {
  std::mutex mutex;
  std::condition_variable cv;
  bool open = false;
  static void wait(void* p) {
    auto* g = static_cast<Gate*>(p);
    std::unique_lock lock(g->mutex);
    g->cv.wait_for(lock, std::chrono::seconds(5), [&] { return g->open; });
  }
  void release() {
    {
      const std::lock_guard lock(mutex);
      open = true;
    }
    cv.notify_all();
  }
};

// cuMemUnmap does not wait for queued work, as CUDA's does not (cuMemFree does): work that uses
// the range is a device fault (device_faults_test.cpp), other work goes on.
TEST_F(ConformanceTest, UnmappingDoesNotWaitForQueuedWork) {
  constexpr std::size_t kGranularity = std::size_t{2} << 20;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemGenericAllocationHandle handle = 0;
  ASSERT_EQ(cuMemCreate(&handle, kGranularity, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr base = 0;
  ASSERT_EQ(cuMemAddressReserve(&base, kGranularity, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemMap(base, kGranularity, 0, handle, 0), CUDA_SUCCESS);

  Stream stream;
  Gate gate;
  DeviceBuffer other(4096);
  PinnedVector host(4096, 1);
  ASSERT_EQ(cuLaunchHostFunc(stream.get(), Gate::wait, &gate), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyHtoDAsync(other.get(), host.data(), 4096, stream.get()), CUDA_SUCCESS);
  const auto start = Clock::now();
  EXPECT_EQ(cuMemUnmap(base, kGranularity), CUDA_SUCCESS);
  EXPECT_LT(seconds_since(start), 2.0) << "cuMemUnmap waited for the gated stream";
  gate.release();
  ASSERT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuMemRelease(handle), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAddressFree(base, kGranularity), CUDA_SUCCESS);
}

// CU_MEMHOSTREGISTER_IOMEMORY is for a third-party device's I/O space: ordinary memory is refused.
// CU_MEMHOSTREGISTER_READ_ONLY memory is read by the device, never written.
TEST_F(ConformanceTest, HostRegistrationFlagsHoldTheirMeaning) {
  std::vector<std::uint8_t> memory(8192, 3);
  EXPECT_EQ(cuMemHostRegister(memory.data(), 4096, CU_MEMHOSTREGISTER_IOMEMORY),
            CUDA_ERROR_NOT_SUPPORTED);
  ASSERT_EQ(cuMemHostRegister(memory.data(), 4096, CU_MEMHOSTREGISTER_READ_ONLY), CUDA_SUCCESS);
  DeviceBuffer buffer(4096);
  Stream stream;
  EXPECT_EQ(cuMemcpyHtoDAsync(buffer.get(), memory.data(), 4096, stream.get()), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyDtoHAsync(memory.data(), buffer.get(), 4096, stream.get()),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyDtoH(memory.data(), buffer.get(), 4096), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuMemHostUnregister(memory.data()), CUDA_SUCCESS);
  // Unregistered, it is ordinary pageable memory again: the device may write it.
  EXPECT_EQ(cuMemcpyDtoH(memory.data(), buffer.get(), 4096), CUDA_SUCCESS);
}

}  // namespace
}  // namespace tide::standin::test
