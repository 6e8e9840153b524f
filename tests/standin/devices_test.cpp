// Devices, primary contexts, the current context, versions and error names.
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/standin/standin_test.h"

namespace tide::standin::test {
namespace {

using DevicesTest = StandinTest;

TEST_F(DevicesTest, OneDeviceByDefaultNamedAsTheStandIn) {
  int count = 0;
  ASSERT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
  EXPECT_EQ(count, 1);
  CUdevice device = -1;
  ASSERT_EQ(cuDeviceGet(&device, 0), CUDA_SUCCESS);
  EXPECT_EQ(device, 0);
  EXPECT_EQ(cuDeviceGet(&device, 1), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cuDeviceGet(&device, -1), CUDA_ERROR_INVALID_DEVICE);

  char name[64];
  ASSERT_EQ(cuDeviceGetName(name, sizeof name, 0), CUDA_SUCCESS);
  EXPECT_STREQ(name, "tide stand-in device 0");
  char shortname[5];
  ASSERT_EQ(cuDeviceGetName(shortname, sizeof shortname, 0), CUDA_SUCCESS);
  EXPECT_STREQ(shortname, "tide");  // truncated, terminated
  EXPECT_EQ(cuDeviceGetName(name, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuDeviceGetName(name, sizeof name, 3), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(DevicesTest, TotalMemoryIsTheDefaultCapacity) {
  std::size_t total = 0;
  ASSERT_EQ(cuDeviceTotalMem(&total, 0), CUDA_SUCCESS);
  EXPECT_EQ(total, std::size_t{8} << 30);
  EXPECT_EQ(cuDeviceTotalMem(&total, 1), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(DevicesTest, AttributesDescribeAHopperLikeDevice) {
  auto attribute = [](CUdevice_attribute a) {
    int value = -1;
    EXPECT_EQ(cuDeviceGetAttribute(&value, a, 0), CUDA_SUCCESS) << a;
    return value;
  };
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), 9);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR), 0);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_WARP_SIZE), 32);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK), 1024);
  EXPECT_GT(attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), 0);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING), 1);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED), 1);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT), 2);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED), 0);  // no cuMemPool*
  int value = 0;
  EXPECT_EQ(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED, 0),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 7),
            CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cuDeviceGetAttribute(nullptr, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0),
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(DevicesTest, DriverVersionIs13) {
  int version = 0;
  ASSERT_EQ(cuDriverGetVersion(&version), CUDA_SUCCESS);
  EXPECT_EQ(version, 13000);
  EXPECT_EQ(cuDriverGetVersion(nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuInit(1), CUDA_ERROR_INVALID_VALUE);  // flags must be 0
  EXPECT_EQ(cuInit(0), CUDA_SUCCESS);              // again: fine
}

TEST_F(DevicesTest, ErrorNamesAndTextsAreTheDrivers) {
  struct Case {
    CUresult code;
    const char* name;
    const char* text;
  };
  const Case cases[] = {
      {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
      {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
      {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
      {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
      {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
      {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
      {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
      {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
      {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
      {CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE",
       "CUDA-capable device(s) is/are busy or unavailable"},
  };
  for (const Case& c : cases) {
    const char* name = nullptr;
    const char* text = nullptr;
    ASSERT_EQ(cuGetErrorName(c.code, &name), CUDA_SUCCESS);
    ASSERT_EQ(cuGetErrorString(c.code, &text), CUDA_SUCCESS);
    EXPECT_STREQ(name, c.name);
    EXPECT_STREQ(text, c.text);
  }
  // Every code the stand-in can return has a name.
  for (CUresult code :
       {CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_CONTEXT_IS_DESTROYED,
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
        CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_UNKNOWN}) {
    const char* name = nullptr;
    EXPECT_EQ(cuGetErrorName(code, &name), CUDA_SUCCESS) << code;
  }
  const char* name = "unchanged";
  EXPECT_EQ(cuGetErrorName(static_cast<CUresult>(998), &name), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(name, nullptr);
}

TEST_F(DevicesTest, PrimaryContextIsCountedAndTheSameHandle) {
  CUcontext again = nullptr;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&again, 0), CUDA_SUCCESS);
  EXPECT_EQ(again, context_);
  ASSERT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  // Still retained once (by the fixture): usable.
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc(&p, 256), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRetain(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuDevicePrimaryCtxRetain(&again, 4), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(4), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(DevicesTest, LastReleaseDestroysTheContextAndItsResources) {
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, 0), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc(&p, 1 << 20), CUDA_SUCCESS);
  const std::uint64_t before = stats().device_bytes_in_use;
  EXPECT_GE(before, 1u << 20);

  ASSERT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);  // the fixture's reference
  // Current but destroyed: every call that needs a current context says so first.
  CUdeviceptr q = 0;
  EXPECT_EQ(cuMemAlloc(&q, 256), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  EXPECT_EQ(cuStreamSynchronize(stream), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  EXPECT_EQ(stats().device_bytes_in_use, before - (1 << 20));
  EXPECT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuCtxSetCurrent(context_), CUDA_ERROR_INVALID_CONTEXT);

  // Retained again for the fixture's teardown: a fresh context with the same handle.
  CUcontext again = nullptr;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&again, 0), CUDA_SUCCESS);
  EXPECT_EQ(again, context_);
  ASSERT_EQ(cuCtxSetCurrent(again), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamSynchronize(stream), CUDA_ERROR_INVALID_HANDLE);  // gone with the old one
  ASSERT_EQ(cuMemAlloc(&q, 256), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(q), CUDA_SUCCESS);
}

TEST_F(DevicesTest, CurrentContextIsPerThread) {
  CUcontext current = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, context_);
  std::thread other([&] {
    CUcontext seen = context_;
    EXPECT_EQ(cuCtxGetCurrent(&seen), CUDA_SUCCESS);
    EXPECT_EQ(seen, nullptr);
    CUdeviceptr p = 0;
    EXPECT_EQ(cuMemAlloc(&p, 256), CUDA_ERROR_INVALID_CONTEXT);
    std::size_t free_bytes = 0;
    std::size_t total = 0;
    EXPECT_EQ(cuMemGetInfo(&free_bytes, &total), CUDA_ERROR_INVALID_CONTEXT);
    CUstream s = nullptr;
    EXPECT_EQ(cuStreamCreate(&s, 0), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cuCtxSetCurrent(context_), CUDA_SUCCESS);
    EXPECT_EQ(cuMemAlloc(&p, 256), CUDA_SUCCESS);
    EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
    EXPECT_EQ(cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  });
  other.join();
  ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, context_);
  EXPECT_EQ(cuCtxSetCurrent(reinterpret_cast<CUcontext>(&current)), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSynchronize_v2(context_), CUDA_SUCCESS);
}

// Every call that works in a context fails without a current one, as in CUDA, whatever valid
// handles it is given, and is counted; the calls that need no context still work there.
TEST_F(DevicesTest, CallsThatNeedAContextFailWithoutOneAndAreCounted) {
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUevent event = nullptr;
  ASSERT_EQ(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc(&p, 4096), CUDA_SUCCESS);
  std::vector<char> host(4096);
  const std::uint64_t before = stats().calls_without_context;
  std::thread bare([&] {
    struct Call {
      const char* name;
      CUresult result;
    };
    CUdeviceptr q = 0;
    CUevent e = nullptr;
    const Call calls[] = {
        {"cuEventRecord", cuEventRecord(event, stream)},
        {"cuEventQuery", cuEventQuery(event)},
        {"cuEventSynchronize", cuEventSynchronize(event)},
        {"cuEventCreate", cuEventCreate(&e, 0)},
        {"cuStreamSynchronize", cuStreamSynchronize(stream)},
        {"cuStreamQuery", cuStreamQuery(stream)},
        {"cuStreamWaitEvent", cuStreamWaitEvent(stream, event, 0)},
        {"cuLaunchHostFunc", cuLaunchHostFunc(
                                 stream, [](void*) {}, nullptr)},
        {"cuMemcpyHtoDAsync", cuMemcpyHtoDAsync(p, host.data(), host.size(), stream)},
        {"cuMemcpyDtoH", cuMemcpyDtoH(host.data(), p, host.size())},
        {"cuMemsetD8Async", cuMemsetD8Async(p, 0, host.size(), stream)},
        {"cuMemAlloc", cuMemAlloc(&q, 256)},
        {"cuMemFree", cuMemFree(p)},
        {"cuMemHostRegister", cuMemHostRegister(host.data(), host.size(), 0)},
        {"cuStreamDestroy", cuStreamDestroy(stream)},
        {"cuEventDestroy", cuEventDestroy(event)},
    };
    for (const Call& c : calls) EXPECT_EQ(c.result, CUDA_ERROR_INVALID_CONTEXT) << c.name;
    EXPECT_EQ(stats().calls_without_context, before + std::size(calls));
    // What needs no context.
    int count = 0;
    EXPECT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
    CUcontext current = context_;
    EXPECT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
    EXPECT_EQ(current, nullptr);
  });
  bare.join();
  // Nothing was done: the handles are all still good in the context.
  EXPECT_EQ(cuEventRecord(event, stream), CUDA_SUCCESS);
  EXPECT_EQ(cuEventSynchronize(event), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(event), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(stream), CUDA_SUCCESS);
}

// Each thread has a stack of contexts: push and pop as in CUDA, cuCtxSetCurrent replaces the top
// (null pops it), the top is current.
TEST_F(DevicesTest, ContextStackPushesAndPopsPerThread) {
  std::thread other([&] {
    CUcontext popped = context_;
    EXPECT_EQ(cuCtxPopCurrent(&popped), CUDA_ERROR_INVALID_CONTEXT);  // empty
    EXPECT_EQ(cuCtxPushCurrent(nullptr), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cuCtxPushCurrent(reinterpret_cast<CUcontext>(&popped)), CUDA_ERROR_INVALID_CONTEXT);
    ASSERT_EQ(cuCtxPushCurrent(context_), CUDA_SUCCESS);
    CUdeviceptr p = 0;
    ASSERT_EQ(cuMemAlloc(&p, 256), CUDA_SUCCESS);
    EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxPushCurrent(context_), CUDA_SUCCESS);  // twice: two entries
    ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
    EXPECT_EQ(popped, context_);
    CUcontext current = nullptr;
    ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
    EXPECT_EQ(current, context_);
    ASSERT_EQ(cuCtxPopCurrent(nullptr), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
    EXPECT_EQ(current, nullptr);
    // Set on an empty stack pushes; set null pops.
    ASSERT_EQ(cuCtxSetCurrent(context_), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
    EXPECT_EQ(popped, context_);
    ASSERT_EQ(cuCtxPushCurrent(context_), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
    EXPECT_EQ(cuCtxPopCurrent(&popped), CUDA_ERROR_INVALID_CONTEXT);
  });
  other.join();
  CUcontext current = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, context_);  // this thread's stack is its own
}

// Retains and releases are counted, and a release with no reference left is refused and counted:
// an extra release somewhere is visible.
TEST_F(DevicesTest, RetainsAndReleasesAreCountedAndAnExtraReleaseIsVisible) {
  tide_standin_reset_stats();
  EXPECT_EQ(stats().primary_ctx_references, 1u);  // the fixture's
  CUcontext again = nullptr;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&again, 0), CUDA_SUCCESS);
  EXPECT_EQ(stats().primary_ctx_references, 2u);
  ASSERT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);  // the fixture's, taken by mistake
  EXPECT_EQ(stats().primary_ctx_references, 0u);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
  const tide_standin_stats s = stats();
  EXPECT_EQ(s.primary_ctx_retains, 1u);
  EXPECT_EQ(s.primary_ctx_releases, 2u);
  EXPECT_EQ(s.unretained_releases, 1u);
  std::uint64_t value = 0;
  ASSERT_EQ(tide_standin_stat("unretained_releases", &value), 0);
  EXPECT_EQ(value, 1u);
  ASSERT_EQ(tide_standin_stat("primary_ctx_references", &value), 0);
  EXPECT_EQ(value, 0u);
  // For the fixture's teardown.
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&again, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(again), CUDA_SUCCESS);
}

TEST_F(DevicesTest, AChildForkedAfterInitCannotUseTheDriver) {
  // As with CUDA: the child has none of the parent's stream workers, so every call fails at
  // once (it would otherwise wait forever for work that nobody runs).
  Stream stream;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 0;
    CUdeviceptr p = 0;
    if (cuInit(0) != CUDA_ERROR_NOT_INITIALIZED) code |= 1;
    if (cuMemAlloc(&p, 256) != CUDA_ERROR_NOT_INITIALIZED) code |= 2;
    if (cuStreamSynchronize(stream.get()) != CUDA_ERROR_NOT_INITIALIZED) code |= 4;
    const char* name = nullptr;
    if (cuGetErrorName(CUDA_ERROR_NOT_INITIALIZED, &name) != CUDA_SUCCESS) code |= 8;
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // The parent is unaffected.
  EXPECT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
}

}  // namespace
}  // namespace tide::standin::test
