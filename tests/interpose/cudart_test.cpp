// The runtime's path: a libcudart loaded the way PyTorch loads it (a global-deps library with
// RTLD_GLOBAL, then the consumer with RTLD_LOCAL), one only in a consumer's local scope, and a
// library with its own static runtime (NCCL). The runtime finds the driver itself (a local
// dlopen, dlsym of cuGetProcAddress_v2, lookups by base name), so every allocation must still
// reach the driver hooks, charged to the runtime call it came from.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "preload_test_support.h"

namespace tide::interpose::test {
namespace {

// TIDE_TEST_SCOPE=local runs only the case where the runtime is in no global scope (a process
// cannot unload libcudart between cases).
bool local_scope_run() {
  const char* scope = std::getenv("TIDE_TEST_SCOPE");
  return scope != nullptr && std::string(scope) == "local";
}

void* open_fake(const char* name, int mode) {
  const char* dir = std::getenv("TIDE_FAKECUDA_DIR");
  EXPECT_NE(dir, nullptr) << "ctest sets TIDE_FAKECUDA_DIR";
  if (dir == nullptr) return nullptr;
  void* handle = dlopen((std::string(dir) + "/" + name).c_str(), RTLD_NOW | mode);
  EXPECT_NE(handle, nullptr) << dlerror();
  return handle;
}

template <typename Fn>
Fn symbol(void* handle, const char* name) {
  auto fn = reinterpret_cast<Fn>(dlsym(handle, name));
  EXPECT_NE(fn, nullptr) << name;
  return fn;
}

using Malloc = int (*)(void**, size_t);
using Free = int (*)(void*);

// Allocates and frees through a consumer's runtime calls; checks what the interposer saw.
void expect_runtime_path(void* consumer) {
  auto malloc_fn = symbol<Malloc>(consumer, "consumer_malloc");
  auto free_fn = symbol<Free>(consumer, "consumer_free");
  const auto before = stats();
  void* ptr = nullptr;
  ASSERT_EQ(malloc_fn(&ptr, 3 << 20), 0);
  EXPECT_STREQ(fake_driver().last_call(), "cuMemAlloc_v2");
  auto during = stats();
  EXPECT_EQ(during.allocations, before.allocations + 1);
  EXPECT_EQ(during.live_bytes, before.live_bytes + (3 << 20));
  EXPECT_EQ(during.runtime_allocations, before.runtime_allocations + 1) << "charged to cudaMalloc";
  EXPECT_EQ(during.runtime_fallback_records, before.runtime_fallback_records)
      << "the driver hook saw it";
  ASSERT_EQ(free_fn(ptr), 0);
  EXPECT_STREQ(fake_driver().last_call(), "cuMemFree_v2");
  EXPECT_EQ(stats().live_bytes, before.live_bytes);
}

class Cudart : public ::testing::Test {
 protected:
  void SetUp() override {
    if (local_scope_run()) GTEST_SKIP() << "TIDE_TEST_SCOPE=local runs LocalScopeOnly only";
    expect_setup();
    deps_ = open_fake("libinterpose_fake_torch_global_deps.so", RTLD_GLOBAL);
    consumer_ = open_fake("libinterpose_fake_torch_cuda.so", RTLD_LOCAL);
    ASSERT_NE(consumer_, nullptr);
  }
  void* deps_ = nullptr;
  void* consumer_ = nullptr;
};

TEST_F(Cudart, LoadedLikePyTorchEveryAllocationReachesTheDriverHooks) {
  expect_runtime_path(consumer_);
}

TEST_F(Cudart, StreamOrderedCallsKeepTheirStreamVariant) {
  const auto before = stats();
  void* ptr = nullptr;
  ASSERT_EQ(symbol<Malloc>(consumer_, "consumer_malloc_async")(&ptr, 1 << 20), 0);
  EXPECT_STREQ(fake_driver().last_call(), "cuMemAllocAsync");
  ASSERT_EQ(symbol<Free>(consumer_, "consumer_free_async")(ptr), 0);
  EXPECT_STREQ(fake_driver().last_call(), "cuMemFreeAsync");
  ASSERT_EQ(symbol<Malloc>(consumer_, "consumer_malloc_async_ptsz")(&ptr, 1 << 20), 0);
  EXPECT_STREQ(fake_driver().last_call(), "cuMemAllocAsync_ptsz");
  ASSERT_EQ(symbol<Free>(consumer_, "consumer_free_async_ptsz")(ptr), 0);
  EXPECT_STREQ(fake_driver().last_call(), "cuMemFreeAsync_ptsz");
  const auto after = stats();
  EXPECT_EQ(after.allocations, before.allocations + 2);
  EXPECT_EQ(after.runtime_allocations, before.runtime_allocations + 2);
  EXPECT_EQ(after.live_bytes, before.live_bytes);
}

TEST_F(Cudart, DriverEntryPointsFromTheRuntimeAreHooks) {
  // PyTorch gets the virtual-memory calls with cudaGetDriverEntryPointByVersion.
  using EntryPoint = int (*)(const char*, unsigned int, unsigned long long, void**);
  auto entry_point = symbol<EntryPoint>(consumer_, "consumer_driver_entry_point");
  for (const char* name : {"cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap",
                           "cuMemAllocAsync", "cuMemGetInfo"}) {
    void* fn = nullptr;
    ASSERT_EQ(entry_point(name, 12000, 0, &fn), 0) << name;
    EXPECT_TRUE(in_preload(fn)) << name;
  }
  void* fn = nullptr;
  ASSERT_EQ(entry_point("cuMemAddressReserve", 12000, 0, &fn), 0);
  EXPECT_EQ(fn, fake_driver().function("cuMemAddressReserve")) << "not hooked: untouched";
}

TEST_F(Cudart, MemGetInfoGoesThroughTheDriverHook) {
  using GetInfo = int (*)(size_t*, size_t*);
  size_t free_bytes = 0;
  size_t total = 0;
  ASSERT_EQ(symbol<GetInfo>(consumer_, "consumer_mem_get_info")(&free_bytes, &total), 0);
  EXPECT_STREQ(fake_driver().last_call(), "cuMemGetInfo_v2");
  EXPECT_GT(total, 0u);
}

TEST_F(Cudart, ARuntimeWhoseDriverCallEscapesIsStillRecorded) {
  // The runtime calls the driver through a path no hook sees: the runtime hook records it.
  auto set_private = symbol<void (*)(int)>(RTLD_DEFAULT, "fakecudart_set_private_path");
  ASSERT_NE(set_private, nullptr);
  set_private(1);
  const auto before = stats();
  void* ptr = nullptr;
  ASSERT_EQ(symbol<Malloc>(consumer_, "consumer_malloc")(&ptr, 1 << 20), 0);
  auto during = stats();
  EXPECT_EQ(during.allocations, before.allocations + 1);
  EXPECT_EQ(during.runtime_fallback_records, before.runtime_fallback_records + 1);
  EXPECT_EQ(during.live_bytes, before.live_bytes + (1 << 20));
  ASSERT_EQ(symbol<Free>(consumer_, "consumer_free")(ptr), 0);
  EXPECT_EQ(stats().live_bytes, before.live_bytes);
  set_private(0);
}

TEST_F(Cudart, AStaticRuntimeLikeNcclReachesTheDriverHooks) {
  void* nccl = open_fake("libinterpose_fake_nccl.so", RTLD_LOCAL);
  ASSERT_NE(nccl, nullptr);
  const auto before = stats();
  void* ptr = nullptr;
  ASSERT_EQ(symbol<Malloc>(nccl, "fake_nccl_alloc")(&ptr, 5 << 20), 0);
  EXPECT_STREQ(fake_driver().last_call(), "cuMemAlloc_v2");
  auto during = stats();
  EXPECT_EQ(during.allocations, before.allocations + 1);
  EXPECT_EQ(during.live_bytes, before.live_bytes + (5 << 20));
  EXPECT_EQ(during.runtime_allocations, before.runtime_allocations)
      << "its runtime is internal: no runtime hook in between";
  ASSERT_EQ(symbol<Free>(nccl, "fake_nccl_free")(ptr), 0);
  EXPECT_EQ(stats().live_bytes, before.live_bytes);
}

TEST(LocalScopeOnly, ARuntimeOnlyInAConsumersLocalScopeIsFound) {
  if (!local_scope_run()) GTEST_SKIP() << "runs as interpose_cudart_local_test";
  expect_setup();
  // No global-deps library: libcudart exists only in the consumer's local scope, where the
  // preload's exported cudaMalloc must find it.
  void* consumer = open_fake("libinterpose_fake_torch_cuda.so", RTLD_LOCAL);
  ASSERT_NE(consumer, nullptr);
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "fakecudart_set_private_path"), nullptr) << "not global";
  expect_runtime_path(consumer);
}

}  // namespace
}  // namespace tide::interpose::test
