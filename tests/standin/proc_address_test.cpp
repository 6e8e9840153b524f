// cuGetProcAddress for every exported function, and the exported symbol list itself.
#include <dlfcn.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "driver/cuda_api.h"
#include "tests/standin/standin_test.h"

namespace tide::standin::test {
namespace {

struct Export {
  const char* symbol;  // the exported name
  const char* name;    // the base name cuGetProcAddress takes
  int version;         // a CUDA version whose lookup returns this symbol
  bool per_thread;     // with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
};

// Every cu* symbol the stand-in exports, and how cuGetProcAddress reaches it.
const Export kExports[] = {
    {"cuInit", "cuInit", 12000, false},
    {"cuDriverGetVersion", "cuDriverGetVersion", 12000, false},
    {"cuGetErrorName", "cuGetErrorName", 12000, false},
    {"cuGetErrorString", "cuGetErrorString", 12000, false},
    {"cuGetProcAddress", "cuGetProcAddress", 11030, false},
    {"cuGetProcAddress_v2", "cuGetProcAddress", 12000, false},
    {"cuDeviceGet", "cuDeviceGet", 12000, false},
    {"cuDeviceGetCount", "cuDeviceGetCount", 12000, false},
    {"cuDeviceGetName", "cuDeviceGetName", 12000, false},
    {"cuDeviceGetPCIBusId", "cuDeviceGetPCIBusId", 12000, false},
    {"cuDeviceTotalMem", "cuDeviceTotalMem", 3010, false},
    {"cuDeviceTotalMem_v2", "cuDeviceTotalMem", 12000, false},
    {"cuDeviceGetAttribute", "cuDeviceGetAttribute", 12000, false},
    {"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 12000, false},
    {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease", 10000, false},
    {"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease", 12000, false},
    {"cuCtxSetCurrent", "cuCtxSetCurrent", 12000, false},
    {"cuCtxGetCurrent", "cuCtxGetCurrent", 12000, false},
    {"cuCtxPushCurrent_v2", "cuCtxPushCurrent", 12000, false},
    {"cuCtxPopCurrent_v2", "cuCtxPopCurrent", 12000, false},
    {"cuCtxSynchronize", "cuCtxSynchronize", 12000, false},
    {"cuCtxSynchronize_v2", "cuCtxSynchronize", 13000, false},
    {"cuMemGetInfo", "cuMemGetInfo", 3010, false},
    {"cuMemGetInfo_v2", "cuMemGetInfo", 12000, false},
    {"cuMemAlloc", "cuMemAlloc", 3010, false},
    {"cuMemAlloc_v2", "cuMemAlloc", 12000, false},
    {"cuMemFree", "cuMemFree", 3010, false},
    {"cuMemFree_v2", "cuMemFree", 12000, false},
    {"cuMemAllocAsync", "cuMemAllocAsync", 12000, false},
    {"cuMemAllocAsync_ptsz", "cuMemAllocAsync", 12000, true},
    {"cuMemFreeAsync", "cuMemFreeAsync", 12000, false},
    {"cuMemFreeAsync_ptsz", "cuMemFreeAsync", 12000, true},
    {"cuPointerGetAttribute", "cuPointerGetAttribute", 12000, false},
    {"cuMemcpyHtoD", "cuMemcpyHtoD", 3010, false},
    {"cuMemcpyHtoD_v2", "cuMemcpyHtoD", 12000, false},
    {"cuMemcpyHtoD_v2_ptds", "cuMemcpyHtoD", 12000, true},
    {"cuMemcpyDtoH", "cuMemcpyDtoH", 3010, false},
    {"cuMemcpyDtoH_v2", "cuMemcpyDtoH", 12000, false},
    {"cuMemcpyDtoH_v2_ptds", "cuMemcpyDtoH", 12000, true},
    {"cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync", 3010, false},
    {"cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync", 12000, false},
    {"cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyHtoDAsync", 12000, true},
    {"cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync", 3010, false},
    {"cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync", 12000, false},
    {"cuMemcpyDtoHAsync_v2_ptsz", "cuMemcpyDtoHAsync", 12000, true},
    {"cuMemcpyDtoDAsync", "cuMemcpyDtoDAsync", 3010, false},
    {"cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync", 12000, false},
    {"cuMemcpyDtoDAsync_v2_ptsz", "cuMemcpyDtoDAsync", 12000, true},
    {"cuMemsetD8Async", "cuMemsetD8Async", 12000, false},
    {"cuMemsetD8Async_ptsz", "cuMemsetD8Async", 12000, true},
    {"cuMemHostRegister", "cuMemHostRegister", 6000, false},
    {"cuMemHostRegister_v2", "cuMemHostRegister", 12000, false},
    {"cuMemHostUnregister", "cuMemHostUnregister", 12000, false},
    {"cuMemHostAlloc", "cuMemHostAlloc", 12000, false},
    {"cuMemFreeHost", "cuMemFreeHost", 12000, false},
    {"cuStreamCreate", "cuStreamCreate", 12000, false},
    {"cuStreamDestroy", "cuStreamDestroy", 3020, false},
    {"cuStreamDestroy_v2", "cuStreamDestroy", 12000, false},
    {"cuStreamSynchronize", "cuStreamSynchronize", 12000, false},
    {"cuStreamSynchronize_ptsz", "cuStreamSynchronize", 12000, true},
    {"cuStreamQuery", "cuStreamQuery", 12000, false},
    {"cuStreamQuery_ptsz", "cuStreamQuery", 12000, true},
    {"cuStreamWaitEvent", "cuStreamWaitEvent", 12000, false},
    {"cuStreamWaitEvent_ptsz", "cuStreamWaitEvent", 12000, true},
    {"cuLaunchHostFunc", "cuLaunchHostFunc", 12000, false},
    {"cuLaunchHostFunc_ptsz", "cuLaunchHostFunc", 12000, true},
    {"cuEventCreate", "cuEventCreate", 12000, false},
    {"cuEventRecord", "cuEventRecord", 12000, false},
    {"cuEventRecord_ptsz", "cuEventRecord", 12000, true},
    {"cuEventQuery", "cuEventQuery", 12000, false},
    {"cuEventSynchronize", "cuEventSynchronize", 12000, false},
    {"cuEventDestroy", "cuEventDestroy", 3020, false},
    {"cuEventDestroy_v2", "cuEventDestroy", 12000, false},
    {"cuEventElapsedTime", "cuEventElapsedTime", 12000, false},
    {"cuEventElapsedTime_v2", "cuEventElapsedTime", 12080, false},
    {"cuModuleLoadData", "cuModuleLoadData", 12000, false},
    {"cuModuleUnload", "cuModuleUnload", 12000, false},
    {"cuModuleGetFunction", "cuModuleGetFunction", 12000, false},
    {"cuLaunchKernel", "cuLaunchKernel", 12000, false},
    {"cuLaunchKernel_ptsz", "cuLaunchKernel", 12000, true},
    {"cuMemGetAllocationGranularity", "cuMemGetAllocationGranularity", 12000, false},
    {"cuMemAddressReserve", "cuMemAddressReserve", 12000, false},
    {"cuMemAddressFree", "cuMemAddressFree", 12000, false},
    {"cuMemCreate", "cuMemCreate", 12000, false},
    {"cuMemRelease", "cuMemRelease", 12000, false},
    {"cuMemMap", "cuMemMap", 12000, false},
    {"cuMemUnmap", "cuMemUnmap", 12000, false},
    {"cuMemSetAccess", "cuMemSetAccess", 12000, false},
};

void* lookup(const char* name, int version, cuuint64_t flags,
             CUdriverProcAddressQueryResult* status = nullptr) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult s{};
  const CUresult r = cuGetProcAddress(name, &fn, version, flags, &s);
  if (status != nullptr) *status = s;
  return r == CUDA_SUCCESS ? fn : nullptr;
}

// As driver/cuda_api.cpp asks: CUDA 12.0 ABI, legacy default stream.
void expect_resolves(const char* name, const char* symbol) {
  CUdriverProcAddressQueryResult status{};
  void* fn = lookup(name, 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS) << name;
  EXPECT_NE(fn, nullptr) << name;
  EXPECT_EQ(fn, dlsym(RTLD_DEFAULT, symbol)) << name << " is not " << symbol;
}

TEST(ProcAddress, EveryFunctionTideUsesResolvesToItsSymbol) {
#define TIDE_CHECK_FUNCTION(name, symbol, required) expect_resolves(#name, symbol);
  TIDE_CUDA_FUNCTIONS(TIDE_CHECK_FUNCTION)
#undef TIDE_CHECK_FUNCTION
}

TEST(ProcAddress, EveryExportIsReachableForItsVersion) {
  for (const Export& e : kExports) {
    const cuuint64_t flags = e.per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                          : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
    void* expected = dlsym(RTLD_DEFAULT, e.symbol);
    ASSERT_NE(expected, nullptr) << e.symbol << " is not exported";
    EXPECT_EQ(lookup(e.name, e.version, flags), expected)
        << e.name << " for " << e.version << (e.per_thread ? " per-thread" : "") << " is not "
        << e.symbol;
    // Default flags mean the legacy stream.
    if (!e.per_thread) {
      EXPECT_EQ(lookup(e.name, e.version, 0), expected) << e.symbol;
    }
  }
}

TEST(ProcAddress, PerThreadVariantsNeedCuda7AndExist) {
  void* v2 = dlsym(RTLD_DEFAULT, "cuMemcpyHtoD_v2");
  EXPECT_EQ(lookup("cuMemcpyHtoD", 6050, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM), v2);
  // Without a per-thread variant, the ordinary function.
  EXPECT_EQ(lookup("cuMemAlloc", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
            dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
}

TEST(ProcAddress, UnknownNamesAndOldVersionsAreNotFound) {
  CUdriverProcAddressQueryResult status{};
  void* fn = &status;
  EXPECT_EQ(cuGetProcAddress("cuNoSuchFunction", &fn, 12000, 0, &status), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(cuGetProcAddress("cuMemCreate", &fn, 10010, 0, &status), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(cuGetProcAddress("cuMemAlloc_v2", &fn, 12000, 0, &status), CUDA_ERROR_NOT_FOUND)
      << "lookups are by base name";
  EXPECT_EQ(cuGetProcAddress("cuInit", &fn, 12000, 0x10, &status), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuGetProcAddress("cuInit", nullptr, 12000, 0, &status), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuGetProcAddress(nullptr, &fn, 12000, 0, &status), CUDA_ERROR_INVALID_VALUE);
  // The status is optional.
  EXPECT_EQ(cuGetProcAddress("cuInit", &fn, 12000, 0, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(fn, dlsym(RTLD_DEFAULT, "cuInit"));
}

TEST(ProcAddress, OnlyDriverAndControlFunctionsAreExported) {
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&cuInit), &info), 0);
  const std::string command =
      std::string("nm -D --defined-only --format=posix '") + info.dli_fname + "' 2>/dev/null";
  std::FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) GTEST_SKIP() << "cannot run nm";
  std::set<std::string> exported;
  char line[1024];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    std::string symbol(line, std::strcspn(line, " \n"));
    const auto at = symbol.find('@');  // a version suffix, if any
    if (at != std::string::npos) symbol.resize(at);
    exported.insert(symbol);
  }
  if (pclose(pipe) != 0 && exported.empty()) GTEST_SKIP() << "nm failed";
  std::set<std::string> expected;
  for (const Export& e : kExports) expected.insert(e.symbol);
  for (const char* control :
       {"tide_standin_get_stats", "tide_standin_stat", "tide_standin_reset_stats",
        "tide_standin_fail_alloc", "tide_standin_fail_copy", "tide_standin_device_lost",
        "tide_standin_fail_pin", "tide_standin_fail_launch", "tide_standin_set_bandwidth",
        "tide_standin_device_memory", "tide_standin_set_capacity", "tide_standin_register_kernel",
        "tide_standin_set_hmm", "tide_standin_record", "tide_standin_recorded", "tide_standin_hold",
        "tide_standin_release", "tide_standin_busy"}) {
    expected.insert(control);
  }
  EXPECT_EQ(exported, expected);
}

TEST(ProcAddress, PerThreadEntryPointsUseTheThreadsDefaultStream) {
  ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  CUcontext context = nullptr;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&context, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(context), CUDA_SUCCESS);
  constexpr cuuint64_t kPerThread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  auto launch = reinterpret_cast<CUresult (*)(CUstream, CUhostFn, void*)>(
      lookup("cuLaunchHostFunc", 12000, kPerThread));
  auto query = reinterpret_cast<CUresult (*)(CUstream)>(lookup("cuStreamQuery", 12000, kPerThread));
  auto sync =
      reinterpret_cast<CUresult (*)(CUstream)>(lookup("cuStreamSynchronize", 12000, kPerThread));
  ASSERT_NE(launch, nullptr);
  ASSERT_NE(query, nullptr);
  ASSERT_NE(sync, nullptr);
  struct Gate {
    std::mutex mutex;
    std::condition_variable cv;
    bool open = false;
  } gate;
  // A null stream here is CU_STREAM_PER_THREAD: blocked, while the legacy stream is idle.
  ASSERT_EQ(launch(
                nullptr,
                [](void* p) {
                  auto* g = static_cast<Gate*>(p);
                  std::unique_lock lock(g->mutex);
                  g->cv.wait_for(lock, std::chrono::seconds(5), [&] { return g->open; });
                },
                &gate),
            CUDA_SUCCESS);
  EXPECT_EQ(query(nullptr), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(cuStreamQuery(CU_STREAM_PER_THREAD), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(cuStreamQuery(CU_STREAM_LEGACY), CUDA_SUCCESS);
  {
    const std::lock_guard lock(gate.mutex);
    gate.open = true;
  }
  gate.cv.notify_all();
  EXPECT_EQ(sync(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(query(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
}

}  // namespace
}  // namespace tide::standin::test
