// Modules and kernel launches: tide's kernels (their own source, compiled for the host) and test
// kernels run on the stream, with parameters copied at launch.
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <vector>

#include "kernels/cast.h"
#include "tests/standin/standin_test.h"

namespace tide::standin::test {
namespace {

// A test kernel: writes `value` to `*out` and records the launch shape.
struct RecordParams {
  std::uint64_t out;  // std::uint64_t* as a device address
  std::uint64_t value;
};

std::mutex g_mutex;
tide_standin_grid g_last_grid{};

void record_kernel(const tide_standin_grid* grid, void** params) {
  RecordParams p;
  std::memcpy(&p, params[0], sizeof p);
  *reinterpret_cast<std::uint64_t*>(p.out) = p.value;
  const std::lock_guard lock(g_mutex);
  g_last_grid = *grid;
}

class KernelsTest : public StandinTest {
 protected:
  void SetUp() override {
    StandinTest::SetUp();
    ASSERT_EQ(
        tide_standin_register_kernel("standin_test_record", record_kernel, sizeof(RecordParams)),
        0);
    ASSERT_EQ(cuModuleLoadData(&module_, kImage), CUDA_SUCCESS);
  }
  void TearDown() override {
    EXPECT_EQ(cuModuleUnload(module_), CUDA_SUCCESS);
    tide_standin_register_kernel("standin_test_record", nullptr, 0);
    StandinTest::TearDown();
  }

  // PTX text: a module has the kernels its image names.
  static constexpr char kImage[] =
      "// PTX\n.entry standin_test_record(\n.entry standin_test_other(\n"
      ".entry tide_cast_f32_to_half(\n";
  CUmodule module_ = nullptr;
};

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

TEST_F(KernelsTest, ModulesAndFunctionsAreLookedUp) {
  CUmodule module = nullptr;
  EXPECT_EQ(cuModuleLoadData(&module, nullptr), CUDA_ERROR_INVALID_VALUE);
  CUfunction f = nullptr;
  EXPECT_EQ(cuModuleGetFunction(&f, module_, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(cuModuleGetFunction(&f, reinterpret_cast<CUmodule>(&f), kernels::kCastKernel),
            CUDA_ERROR_INVALID_HANDLE);
  ASSERT_EQ(cuModuleGetFunction(&f, module_, kernels::kCastKernel), CUDA_SUCCESS);
  CUfunction again = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&again, module_, kernels::kCastKernel), CUDA_SUCCESS);
  EXPECT_EQ(f, again);
  // A function of an unloaded module cannot be launched.
  ASSERT_EQ(cuModuleLoadData(&module, kImage), CUDA_SUCCESS);
  ASSERT_EQ(cuModuleGetFunction(&f, module, "standin_test_record"), CUDA_SUCCESS);
  ASSERT_EQ(cuModuleUnload(module), CUDA_SUCCESS);
  EXPECT_EQ(cuModuleUnload(module), CUDA_ERROR_INVALID_HANDLE);
  std::uint64_t out = 0;
  RecordParams params{reinterpret_cast<std::uint64_t>(&out), 1};
  void* args[] = {&params};
  EXPECT_EQ(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr),
            CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(KernelsTest, CastKernelRunsItsOwnSource) {
  CUfunction cast = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&cast, module_, kernels::kCastKernel), CUDA_SUCCESS);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  const std::size_t count = 5000;
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  DeviceBuffer src(count * sizeof(float));
  DeviceBuffer dst(count * sizeof(std::uint16_t));
  ASSERT_EQ(cuMemcpyHtoD(src.get(), values.data(), count * sizeof(float)), CUDA_SUCCESS);
  Stream stream;
  const tide_standin_stats before = stats();
  kernels::CastParams params{src.get(), dst.get(), count, kernels::Dtype::kBFloat16};
  void* args[] = {&params};
  ASSERT_EQ(cuLaunchKernel(cast, 20, 1, 1, 256, 1, 1, 0, stream.get(), args, nullptr),
            CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
  EXPECT_EQ(stats().kernel_launches - before.kernel_launches, 1u);
  std::vector<std::uint16_t> out(count);
  ASSERT_EQ(cuMemcpyDtoH(out.data(), dst.get(), count * sizeof(std::uint16_t)), CUDA_SUCCESS);
  for (std::size_t i = 0; i < count; ++i) {
    ASSERT_EQ(out[i], kernels::cast_element(values[i], kernels::Dtype::kBFloat16)) << i;
  }
}

// Launches from a stack frame that is gone (and overwritten) before the kernel runs.
void launch_from_a_dying_frame(CUfunction f, CUstream stream, std::uint64_t* out) {
  RecordParams params{reinterpret_cast<std::uint64_t>(out), 1234};
  void* args[] = {&params};
  ASSERT_EQ(cuLaunchKernel(f, 3, 2, 1, 32, 4, 1, 128, stream, args, nullptr), CUDA_SUCCESS);
  params.value = 999;  // too late: the launch copied the parameters
}

TEST_F(KernelsTest, ParametersAreCopiedAtLaunch) {
  CUfunction f = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&f, module_, "standin_test_record"), CUDA_SUCCESS);
  Stream stream;
  Gate gate;
  ASSERT_EQ(cuLaunchHostFunc(stream.get(), Gate::wait, &gate), CUDA_SUCCESS);
  std::uint64_t out = 0;
  launch_from_a_dying_frame(f, stream.get(), &out);
  {
    volatile char scribble[512];  // reuse the stack the parameters were on
    for (auto& c : scribble) c = 0x5a;
  }
  gate.release();
  ASSERT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
  EXPECT_EQ(out, 1234u);
  const std::lock_guard lock(g_mutex);
  EXPECT_EQ(g_last_grid.grid[0], 3u);
  EXPECT_EQ(g_last_grid.grid[1], 2u);
  EXPECT_EQ(g_last_grid.block[0], 32u);
  EXPECT_EQ(g_last_grid.block[1], 4u);
  EXPECT_EQ(g_last_grid.shared_bytes, 128u);
}

// An armed launch failure fails the nth valid launch from the arming, once: the call returns the
// error and the kernel never runs; launches refused for their arguments are not counted.
TEST_F(KernelsTest, TheNthLaunchFailsOnceAndRunsNothing) {
  CUfunction f = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&f, module_, "standin_test_record"), CUDA_SUCCESS);
  Stream stream;
  std::uint64_t out[3] = {};
  auto launch = [&](int i) {
    RecordParams params{reinterpret_cast<std::uint64_t>(&out[i]), 100u + i};
    void* args[] = {&params};
    return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream.get(), args, nullptr);
  };
  const tide_standin_stats before = stats();
  ASSERT_EQ(tide_standin_fail_launch(2), 0);
  ASSERT_EQ(launch(0), CUDA_SUCCESS);
  RecordParams unused{0, 0};
  void* args[] = {&unused};
  EXPECT_EQ(cuLaunchKernel(f, 0, 1, 1, 1, 1, 1, 0, stream.get(), args, nullptr),
            CUDA_ERROR_INVALID_VALUE);  // not a launch: the second one is still to come
  EXPECT_EQ(launch(1), CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(launch(2), CUDA_SUCCESS);  // once only, and the stream stays usable
  ASSERT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
  EXPECT_EQ(out[0], 100u);
  EXPECT_EQ(out[1], 0u);
  EXPECT_EQ(out[2], 102u);
  const tide_standin_stats after = stats();
  EXPECT_EQ(after.kernel_launches - before.kernel_launches, 2u);
  EXPECT_EQ(after.injected_faults - before.injected_faults, 1u);

  ASSERT_EQ(tide_standin_fail_launch(1), 0);
  ASSERT_EQ(tide_standin_fail_launch(0), 0);  // disarmed
  EXPECT_EQ(launch(1), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
  EXPECT_EQ(out[1], 101u);
}

TEST_F(KernelsTest, ParametersMayComeAsOneBuffer) {
  CUfunction f = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&f, module_, "standin_test_record"), CUDA_SUCCESS);
  std::uint64_t out = 0;
  RecordParams params{reinterpret_cast<std::uint64_t>(&out), 77};
  std::size_t size = sizeof params;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &params, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  ASSERT_EQ(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, extra), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(out, 77u);
  size = 8;  // not the kernel's parameter size
  EXPECT_EQ(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, extra),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr),
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(KernelsTest, EmptyOrOversizedShapesAreInvalid) {
  CUfunction f = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&f, module_, "standin_test_record"), CUDA_SUCCESS);
  std::uint64_t out = 0;
  RecordParams params{reinterpret_cast<std::uint64_t>(&out), 1};
  void* args[] = {&params};
  const unsigned shapes[][6] = {
      {0, 1, 1, 1, 1, 1},    {1, 0, 1, 1, 1, 1},   {1, 1, 0, 1, 1, 1},
      {1, 1, 1, 0, 1, 1},    {1, 1, 1, 1, 0, 1},   {1, 1, 1, 1, 1, 0},
      {1, 1, 1, 1025, 1, 1}, {1, 1, 1, 512, 4, 1}, {1, 70000, 1, 1, 1, 1}};
  for (const auto& s : shapes) {
    EXPECT_EQ(cuLaunchKernel(f, s[0], s[1], s[2], s[3], s[4], s[5], 0, nullptr, args, nullptr),
              CUDA_ERROR_INVALID_VALUE);
  }
  EXPECT_EQ(cuStreamSynchronize(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(out, 0u);  // none of them ran
}

TEST_F(KernelsTest, RegisteredKernelsComeAndGo) {
  ASSERT_EQ(tide_standin_register_kernel("standin_test_other", record_kernel, 16), 0);
  CUfunction f = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&f, module_, "standin_test_other"), CUDA_SUCCESS);
  ASSERT_EQ(tide_standin_register_kernel("standin_test_other", nullptr, 0), 0);
  CUmodule fresh = nullptr;
  ASSERT_EQ(cuModuleLoadData(&fresh, kImage), CUDA_SUCCESS);
  EXPECT_EQ(cuModuleGetFunction(&f, fresh, "standin_test_other"), CUDA_ERROR_NOT_FOUND);
  ASSERT_EQ(cuModuleUnload(fresh), CUDA_SUCCESS);
  EXPECT_EQ(tide_standin_register_kernel(nullptr, record_kernel, 0), CUDA_ERROR_INVALID_VALUE);
}

}  // namespace
}  // namespace tide::standin::test
