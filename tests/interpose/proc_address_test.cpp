// The interposer seen from a CUDA runtime: dlopen("libcuda.so.1") with a local handle,
// dlsym(handle, "cuGetProcAddress_v2"), then base names at the caller's CUDA version and flags.
// Every answer must be tide's hook of exactly the function the driver would have returned, or
// that function itself where tide does not hook its ABI.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "preload_test_support.h"

namespace tide::interpose::test {
namespace {

using GetProcV2 = CUresult (*)(const char*, void**, int, cuuint64_t,
                               CUdriverProcAddressQueryResult*);
using GetProcV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
using MemAlloc = CUresult (*)(CUdeviceptr*, size_t);
using MemAllocPitch = CUresult (*)(CUdeviceptr*, size_t*, size_t, size_t, unsigned int);
using MemAllocManaged = CUresult (*)(CUdeviceptr*, size_t, unsigned int);
using MemFree = CUresult (*)(CUdeviceptr);
using MemGetInfo = CUresult (*)(size_t*, size_t*);
using DeviceTotalMem = CUresult (*)(size_t*, CUdevice);
using MemCreate = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                               unsigned long long);
using MemRelease = CUresult (*)(CUmemGenericAllocationHandle);
using MemMap = CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                            unsigned long long);
using MemUnmap = CUresult (*)(CUdeviceptr, size_t);
using AddressReserve = CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
using MemAllocAsync = CUresult (*)(CUdeviceptr*, size_t, CUstream);
using MemFreeAsync = CUresult (*)(CUdeviceptr, CUstream);
using MemAllocFromPool = CUresult (*)(CUdeviceptr*, size_t, CUmemoryPool, CUstream);
using GetExportTable = CUresult (*)(const void**, const CUuuid*);

constexpr cuuint64_t kDefault = CU_GET_PROC_ADDRESS_DEFAULT;
constexpr cuuint64_t kLegacy = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
constexpr cuuint64_t kPerThread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

class ProcAddress : public ::testing::Test {
 protected:
  void SetUp() override {
    expect_setup();
    // How the runtime finds cuGetProcAddress: dlsym on its local handle, which the preload's
    // dlsym answers with its hook.
    get_proc_ = reinterpret_cast<GetProcV2>(dlsym(fake_driver().handle, "cuGetProcAddress_v2"));
    ASSERT_NE(get_proc_, nullptr);
  }

  void* lookup(const char* symbol, int version, cuuint64_t flags) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    EXPECT_EQ(get_proc_(symbol, &fn, version, flags, &status), CUDA_SUCCESS)
        << symbol << " at " << version;
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
    return fn;
  }

  // The preload's hook for an exact exported name, as dlsym gives it.
  template <typename Fn>
  Fn hooked(const char* name) {
    return reinterpret_cast<Fn>(dlsym(fake_driver().handle, name));
  }

  static std::string last() { return fake_driver().last_call(); }

  // Calls `fn` (the answer for base name `symbol`) with real arguments and returns the name of
  // the stand-in function it reached.
  std::string exercise(const std::string& symbol, void* fn) {
    const auto before = stats();
    std::string reached;
    if (symbol == "cuMemAlloc") {
      CUdeviceptr ptr = 0;
      EXPECT_EQ(reinterpret_cast<MemAlloc>(fn)(&ptr, 4096), CUDA_SUCCESS);
      reached = last();
      EXPECT_EQ(stats().allocations, before.allocations + 1);
      EXPECT_EQ(hooked<MemFree>("cuMemFree_v2")(ptr), CUDA_SUCCESS);
    } else if (symbol == "cuMemAllocPitch") {
      CUdeviceptr ptr = 0;
      size_t pitch = 0;
      EXPECT_EQ(reinterpret_cast<MemAllocPitch>(fn)(&ptr, &pitch, 100, 4, 4), CUDA_SUCCESS);
      reached = last();
      EXPECT_EQ(pitch, 512u);
      EXPECT_EQ(stats().live_bytes, before.live_bytes + 512 * 4) << "pitch padding counts";
      EXPECT_EQ(hooked<MemFree>("cuMemFree_v2")(ptr), CUDA_SUCCESS);
    } else if (symbol == "cuMemAllocManaged") {
      CUdeviceptr ptr = 0;
      EXPECT_EQ(reinterpret_cast<MemAllocManaged>(fn)(&ptr, 4096, CU_MEM_ATTACH_GLOBAL),
                CUDA_SUCCESS);
      reached = last();
      EXPECT_EQ(hooked<MemFree>("cuMemFree_v2")(ptr), CUDA_SUCCESS);
    } else if (symbol == "cuMemFree") {
      CUdeviceptr ptr = 0;
      EXPECT_EQ(hooked<MemAlloc>("cuMemAlloc_v2")(&ptr, 4096), CUDA_SUCCESS);
      EXPECT_EQ(reinterpret_cast<MemFree>(fn)(ptr), CUDA_SUCCESS);
      reached = last();
      EXPECT_EQ(stats().frees, before.frees + 1);
    } else if (symbol == "cuMemGetInfo") {
      size_t free_bytes = 0;
      size_t total = 0;
      EXPECT_EQ(reinterpret_cast<MemGetInfo>(fn)(&free_bytes, &total), CUDA_SUCCESS);
      reached = last();
      EXPECT_GT(total, 0u);
    } else if (symbol == "cuDeviceTotalMem") {
      size_t total = 0;
      EXPECT_EQ(reinterpret_cast<DeviceTotalMem>(fn)(&total, 0), CUDA_SUCCESS);
      reached = last();
    } else if (symbol == "cuMemCreate" || symbol == "cuMemRelease" || symbol == "cuMemMap" ||
               symbol == "cuMemUnmap") {
      CUmemAllocationProp prop{};
      prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = 0;
      const size_t size = 2 << 20;
      CUmemGenericAllocationHandle handle = 0;
      auto create = symbol == "cuMemCreate" ? reinterpret_cast<MemCreate>(fn)
                                            : hooked<MemCreate>("cuMemCreate");
      EXPECT_EQ(create(&handle, size, &prop, 0), CUDA_SUCCESS);
      if (symbol == "cuMemCreate") reached = last();
      CUdeviceptr va = 0;
      EXPECT_EQ(fake_driver().real<AddressReserve>("cuMemAddressReserve")(&va, size, 0, 0, 0),
                CUDA_SUCCESS);
      auto map = symbol == "cuMemMap" ? reinterpret_cast<MemMap>(fn) : hooked<MemMap>("cuMemMap");
      EXPECT_EQ(map(va, size, 0, handle, 0), CUDA_SUCCESS);
      if (symbol == "cuMemMap") reached = last();
      auto unmap =
          symbol == "cuMemUnmap" ? reinterpret_cast<MemUnmap>(fn) : hooked<MemUnmap>("cuMemUnmap");
      EXPECT_EQ(unmap(va, size), CUDA_SUCCESS);
      if (symbol == "cuMemUnmap") reached = last();
      auto release = symbol == "cuMemRelease" ? reinterpret_cast<MemRelease>(fn)
                                              : hooked<MemRelease>("cuMemRelease");
      EXPECT_EQ(release(handle), CUDA_SUCCESS);
      if (symbol == "cuMemRelease") reached = last();
      EXPECT_EQ(stats().live_bytes, before.live_bytes);
      EXPECT_EQ(stats().allocations, before.allocations + 1);
    } else if (symbol == "cuMemAllocAsync") {
      CUdeviceptr ptr = 0;
      EXPECT_EQ(reinterpret_cast<MemAllocAsync>(fn)(&ptr, 4096, nullptr), CUDA_SUCCESS);
      reached = last();
      EXPECT_EQ(stats().allocations, before.allocations + 1);
      EXPECT_EQ(hooked<MemFreeAsync>("cuMemFreeAsync")(ptr, nullptr), CUDA_SUCCESS);
    } else if (symbol == "cuMemFreeAsync") {
      CUdeviceptr ptr = 0;
      EXPECT_EQ(hooked<MemAllocAsync>("cuMemAllocAsync")(&ptr, 4096, nullptr), CUDA_SUCCESS);
      EXPECT_EQ(reinterpret_cast<MemFreeAsync>(fn)(ptr, nullptr), CUDA_SUCCESS);
      reached = last();
      EXPECT_EQ(stats().frees, before.frees + 1);
    } else if (symbol == "cuMemAllocFromPoolAsync") {
      CUdeviceptr ptr = 0;
      EXPECT_EQ(reinterpret_cast<MemAllocFromPool>(fn)(&ptr, 4096, nullptr, nullptr), CUDA_SUCCESS);
      reached = last();
      EXPECT_EQ(hooked<MemFreeAsync>("cuMemFreeAsync")(ptr, nullptr), CUDA_SUCCESS);
    } else if (symbol == "cuGetProcAddress") {
      void* init = nullptr;
      CUdriverProcAddressQueryResult status{};
      EXPECT_EQ(reinterpret_cast<GetProcV2>(fn)("cuInit", &init, 12000, 0, &status), CUDA_SUCCESS);
      reached = last();
      EXPECT_EQ(init, fake_driver().function("cuInit"));
    } else {
      ADD_FAILURE() << "no exercise for " << symbol;
    }
    // Whatever it did, it left nothing behind.
    EXPECT_EQ(stats().live_bytes, before.live_bytes) << symbol;
    return reached;
  }

  GetProcV2 get_proc_ = nullptr;
};

struct Expected {
  const char* symbol;      // the base name a caller asks for
  int since;               // the version the runtime asks at (its current ABI's introduction)
  const char* legacy;      // the function reached with flags 0 or LEGACY_STREAM
  const char* per_thread;  // ... with PER_THREAD_DEFAULT_STREAM
};

constexpr Expected kHooked[] = {
    {"cuMemAlloc", 3020, "cuMemAlloc_v2", "cuMemAlloc_v2"},
    {"cuMemAllocPitch", 3020, "cuMemAllocPitch_v2", "cuMemAllocPitch_v2"},
    {"cuMemAllocManaged", 6000, "cuMemAllocManaged", "cuMemAllocManaged"},
    {"cuMemFree", 3020, "cuMemFree_v2", "cuMemFree_v2"},
    {"cuMemGetInfo", 3020, "cuMemGetInfo_v2", "cuMemGetInfo_v2"},
    {"cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2", "cuDeviceTotalMem_v2"},
    {"cuMemCreate", 10020, "cuMemCreate", "cuMemCreate"},
    {"cuMemRelease", 10020, "cuMemRelease", "cuMemRelease"},
    {"cuMemMap", 10020, "cuMemMap", "cuMemMap"},
    {"cuMemUnmap", 10020, "cuMemUnmap", "cuMemUnmap"},
    {"cuMemAllocAsync", 11020, "cuMemAllocAsync", "cuMemAllocAsync_ptsz"},
    {"cuMemFreeAsync", 11020, "cuMemFreeAsync", "cuMemFreeAsync_ptsz"},
    {"cuMemAllocFromPoolAsync", 11020, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"},
    {"cuGetProcAddress", 12000, "cuGetProcAddress_v2", "cuGetProcAddress_v2"},
};

TEST_F(ProcAddress, DlsymOnALocalDriverHandleAnswersWithTheHook) {
  EXPECT_TRUE(in_preload(reinterpret_cast<void*>(get_proc_)));
  void* v1 = dlsym(fake_driver().handle, "cuGetProcAddress");
  EXPECT_TRUE(in_preload(v1));
  EXPECT_NE(v1, reinterpret_cast<void*>(get_proc_)) << "two ABIs, two hooks";
  // The driver is loaded with a local handle only: the global scope has no cuGetProcAddress_v2,
  // as without the preload (whose own export of the name is not an answer here).
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2"), nullptr);
}

TEST_F(ProcAddress, EveryHookedNameAtEveryVersionAndFlagReachesItsExactFunction) {
  for (const Expected& e : kHooked) {
    for (const int version : {e.since, 12000, 12090, 13000}) {
      for (const cuuint64_t flags : {kDefault, kLegacy, kPerThread}) {
        SCOPED_TRACE(std::string(e.symbol) + " at " + std::to_string(version) + ", flags " +
                     std::to_string(flags));
        void* fn = lookup(e.symbol, version, flags);
        ASSERT_NE(fn, nullptr);
        EXPECT_TRUE(in_preload(fn)) << "not hooked";
        EXPECT_EQ(exercise(e.symbol, fn), flags == kPerThread ? e.per_thread : e.legacy);
      }
    }
  }
}

TEST_F(ProcAddress, HooksAreBoundPerFunctionNotPerName) {
  // The same function twice: the same hook. Legacy and per-thread variants: different hooks.
  EXPECT_EQ(lookup("cuMemAlloc", 12000, kDefault), lookup("cuMemAlloc", 13000, kPerThread));
  EXPECT_EQ(lookup("cuMemAllocAsync", 12000, kDefault), lookup("cuMemAllocAsync", 13000, kLegacy));
  EXPECT_NE(lookup("cuMemAllocAsync", 13000, kDefault),
            lookup("cuMemAllocAsync", 13000, kPerThread));
  // dlsym of the exact name gives the hook bound to the same function as cuGetProcAddress.
  EXPECT_EQ(dlsym(fake_driver().handle, "cuMemAllocAsync_ptsz"),
            lookup("cuMemAllocAsync", 13000, kPerThread));
  EXPECT_EQ(dlsym(fake_driver().handle, "cuMemAlloc_v2"), lookup("cuMemAlloc", 13000, kDefault));
}

TEST_F(ProcAddress, OlderAbisPassThroughUnhooked) {
  // CUDA 3.0 callers get the 32-bit cuMemAlloc: never the _v2 hook.
  for (const char* symbol : {"cuMemAlloc", "cuMemFree", "cuMemGetInfo", "cuDeviceTotalMem"}) {
    EXPECT_EQ(lookup(symbol, 3000, kDefault), fake_driver().function(symbol)) << symbol;
  }
  // cuGetProcAddress at 11.3 is the 4-argument ABI: its own hook, bound to the v1 function.
  void* v1 = lookup("cuGetProcAddress", 11030, kDefault);
  EXPECT_TRUE(in_preload(v1));
  void* init = nullptr;
  EXPECT_EQ(reinterpret_cast<GetProcV1>(v1)("cuInit", &init, 12000, 0), CUDA_SUCCESS);
  EXPECT_STREQ(fake_driver().last_call(), "cuGetProcAddress");
  EXPECT_EQ(init, fake_driver().function("cuInit"));
  // dlsym of a legacy name is the legacy function itself.
  EXPECT_EQ(dlsym(fake_driver().handle, "cuMemAlloc"), fake_driver().function("cuMemAlloc"));
}

TEST_F(ProcAddress, ANewerAbiThanTideKnowsIsNeverHooked) {
  // The stand-in's made-up CUDA 14.0 cuMemAlloc has another signature: passed through.
  EXPECT_EQ(lookup("cuMemAlloc", 14000, kDefault), fake_driver().function("cuMemAlloc_v3"));
  // A newer version whose ABI did not change is hooked as usual.
  void* free_fn = lookup("cuMemFree", 14000, kDefault);
  EXPECT_TRUE(in_preload(free_fn));
  EXPECT_EQ(free_fn, lookup("cuMemFree", 13000, kDefault));
}

TEST_F(ProcAddress, ExportTableAndUnhookedNamesPassThroughUntouched) {
  void* table_fn = lookup("cuGetExportTable", 13000, kDefault);
  EXPECT_EQ(table_fn, fake_driver().function("cuGetExportTable"));
  EXPECT_EQ(dlsym(fake_driver().handle, "cuGetExportTable"), table_fn);
  const void* table = nullptr;
  const CUuuid id{};
  EXPECT_EQ(reinterpret_cast<GetExportTable>(table_fn)(&table, &id), CUDA_SUCCESS);
  EXPECT_EQ(table, dlsym(fake_driver().handle, "fakecuda_export_table"));
  EXPECT_EQ(lookup("cuInit", 12000, kDefault), fake_driver().function("cuInit"));
}

TEST_F(ProcAddress, LookupFailuresAreTheDriversOwn) {
  void* fn = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  EXPECT_EQ(get_proc_("cuNoSuchFunction", &fn, 13000, 0, &status), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(get_proc_("cuMemAllocAsync", &fn, 11000, 0, &status), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  // Null output pointers go to the driver, which refuses them.
  EXPECT_EQ(get_proc_("cuMemAlloc", nullptr, 13000, 0, &status), CUDA_ERROR_INVALID_VALUE);
  // dlsym of a missing name: null, with dlerror() set.
  dlerror();
  EXPECT_EQ(dlsym(fake_driver().handle, "cuMemAllocNoSuchVersion"), nullptr);
  EXPECT_NE(dlerror(), nullptr);
}

TEST_F(ProcAddress, HooksReturnTheDriversErrorsAndHandleNullOutputs) {
  auto alloc = hooked<MemAlloc>("cuMemAlloc_v2");
  auto free_fn = hooked<MemFree>("cuMemFree_v2");
  const auto before = stats();
  EXPECT_EQ(alloc(nullptr, 4096), CUDA_ERROR_INVALID_VALUE);
  EXPECT_STREQ(fake_driver().last_call(), "cuMemAlloc_v2") << "the driver answered";
  CUdeviceptr ptr = 0;
  EXPECT_EQ(alloc(&ptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(free_fn(0xdead000), CUDA_ERROR_INVALID_VALUE) << "not an allocation";
  EXPECT_EQ(hooked<MemGetInfo>("cuMemGetInfo_v2")(nullptr, nullptr), CUDA_ERROR_INVALID_VALUE);
  size_t total = 0;
  EXPECT_EQ(hooked<MemGetInfo>("cuMemGetInfo_v2")(nullptr, &total), CUDA_SUCCESS);
  EXPECT_EQ(hooked<DeviceTotalMem>("cuDeviceTotalMem_v2")(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(hooked<MemCreate>("cuMemCreate")(nullptr, 4096, nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  const auto after = stats();
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_EQ(after.live_bytes, before.live_bytes);
}

TEST_F(ProcAddress, AllocationsAreChargedToTheCurrentDevice) {
  auto alloc = hooked<MemAlloc>("cuMemAlloc_v2");
  auto free_fn = hooked<MemFree>("cuMemFree_v2");
  fake_driver().set_device(1);
  CUdeviceptr ptr = 0;
  ASSERT_EQ(alloc(&ptr, 1 << 20), CUDA_SUCCESS);
  fake_driver().set_device(0);
  EXPECT_EQ(stats(1).live_bytes, 1u << 20);
  EXPECT_EQ(stats(0).live_bytes, 0u);
  EXPECT_EQ(free_fn(ptr), CUDA_SUCCESS);
  EXPECT_EQ(stats(1).live_bytes, 0u);
  EXPECT_EQ(stats(1).peak_bytes, 1u << 20);
}

// On a thread with no current context (a PyTorch pin-memory or data-loader thread) the hooks do
// not ask the driver which device is current: cuCtxGetDevice there is an API error that the
// NVIDIA driver reports to debuggers (seen on an H200 under tide run).
TEST_F(ProcAddress, AThreadWithoutAContextIsNotAskedForItsDevice) {
  using Count = unsigned long (*)();
  auto without =
      reinterpret_cast<Count>(dlsym(fake_driver().handle, "fakecuda_calls_without_context"));
  ASSERT_NE(without, nullptr);
  auto alloc = hooked<MemAlloc>("cuMemAlloc_v2");
  auto info = hooked<MemGetInfo>("cuMemGetInfo_v2");
  const unsigned long before = without();
  fake_driver().set_device(-1);
  CUdeviceptr ptr = 0;
  EXPECT_EQ(alloc(&ptr, 1 << 20), CUDA_ERROR_INVALID_CONTEXT);
  std::size_t total = 0;
  info(nullptr, &total);
  fake_driver().set_device(0);
  EXPECT_EQ(without(), before);
  EXPECT_EQ(stats(0).live_bytes, 0u);
}

TEST(PreloadDlsym, RtldNextStaysRelativeToTheCaller) {
  ASSERT_TRUE(preloaded());
  // From the program, "next" starts right after it: the preload's own dlsym. A dlsym wrapper
  // that called glibc's instead of jumping to it would answer glibc's (next after the preload).
  void* next = dlsym(RTLD_NEXT, "dlsym");
  EXPECT_TRUE(in_preload(next));
  void* next_malloc = dlsym(RTLD_NEXT, "malloc");
  Dl_info info{};
  ASSERT_NE(dladdr(next_malloc, &info), 0);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  EXPECT_EQ(std::strstr(info.dli_fname, "libtide_preload"), nullptr) << info.dli_fname;
#else
  EXPECT_NE(std::strstr(info.dli_fname, "libc.so"), nullptr) << info.dli_fname;
#endif
}

TEST(PreloadDlsym, MallocIsStillGlibcs) {
  ASSERT_TRUE(preloaded());
  for (const char* name : {"malloc", "free", "calloc", "realloc", "posix_memalign"}) {
    Dl_info info{};
    void* fn = dlsym(RTLD_DEFAULT, name);
    ASSERT_NE(dladdr(fn, &info), 0) << name;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    // The sanitizer runtime owns malloc in these builds; the point is that tide does not.
    EXPECT_EQ(std::strstr(info.dli_fname, "libtide_preload"), nullptr) << name;
#else
    EXPECT_NE(std::strstr(info.dli_fname, "libc.so"), nullptr) << name << ": " << info.dli_fname;
#endif
  }
}

}  // namespace
}  // namespace tide::interpose::test
