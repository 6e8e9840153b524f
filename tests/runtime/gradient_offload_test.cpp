// Gradient offload during backward: the caller is never blocked, the copy waits for the stream
// that produced the gradient, and the update sees exactly the offloaded gradients.
#include <atomic>
#include <cstring>
#include <vector>

#include "tests/runtime/executor_fixture.h"

namespace tide::runtime::testing {
namespace {

constexpr std::uint64_t kHeadroom = std::uint64_t{1} << 30;
using Clock = std::chrono::steady_clock;

struct OffloadTest : ::testing::Test {
  allocator::testing::DeviceStandin standin;
  void TearDown() override { standin.set_bandwidth(0, 0); }
};

TEST_F(OffloadTest, ReturnsWhileASlowCopyIsInFlight) {
  const driver::CurrentContext context;
  const std::uint64_t n = std::uint64_t{1} << 21;  // 4 MiB of bf16
  Model model({n, n});
  Reference ref(*model.state);
  ExecutorOptions options;
  options.rates = test_rates();
  Executor executor(*model.state, options);
  auto grads = model.make_gradients(1);
  standin.set_bandwidth(0, 0.04);  // 4 MiB in ~100 ms each
  const auto t0 = Clock::now();
  model.offload_all(executor);
  const double call_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto t1 = Clock::now();
  executor.offload().synchronize_all();
  const double copy_s = std::chrono::duration<double>(Clock::now() - t1).count();
  EXPECT_LT(call_s, 0.05) << "offload blocked its caller";
  EXPECT_GT(copy_s, 0.1) << "the simulated copy should still have been running";
  standin.set_bandwidth(0, 0);
  const PhaseReport& r = executor.run(hyper(1), Policy::every(2), kHeadroom);
  EXPECT_EQ(r.ran.gpu_order.size(), 1u);
  ref.step(grads, hyper(1));
  expect_matches(model, ref);
}

// The producer stream is still writing the gradient (a slow copy) when offload is called: the
// offload waits for it by event, so the update sees the new values, not the old ones.
TEST_F(OffloadTest, WaitsForTheProducingStream) {
  for (const Policy& policy : {Policy::all_cpu(), Policy::all_gpu()}) {
    const driver::CurrentContext context;
    const std::uint64_t n = std::uint64_t{1} << 20;
    Model model({n, n});
    Reference ref(*model.state);
    ExecutorOptions options;
    options.rates = test_rates();
    Executor executor(*model.state, options);
    model.make_gradients(1);  // stale values on the device
    std::vector<std::vector<std::uint16_t>> fresh(2, std::vector<std::uint16_t>(n));
    for (std::size_t i = 0; i < 2; ++i) {
      for (std::uint64_t e = 0; e < n; ++e)
        fresh[i][e] = kernels::float_to_bf16(value_at(77 + i, e, 0.25f));
    }
    auto registration0 = driver::HostRegistration(fresh[0].data(), n * 2);
    auto registration1 = driver::HostRegistration(fresh[1].data(), n * 2);
    driver::Stream producer;
    standin.set_bandwidth(0.05, 0);  // the "backward" writes slowly: ~40 ms per gradient
    for (std::size_t i = 0; i < 2; ++i) {
      driver::copy_to_device_async(model.grads[i].get(), fresh[i].data(), n * 2, producer);
    }
    const auto t0 = Clock::now();
    model.offload_all(executor, producer.get());
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 0.03);
    const PhaseReport& r = executor.run(hyper(1), policy, kHeadroom);
    (void)r;
    standin.set_bandwidth(0, 0);
    ref.step(fresh, hyper(1));
    expect_matches(model, ref);
  }
}

// Offloads from several threads at once (autograd may call hooks from its worker threads).
TEST_F(OffloadTest, ConcurrentOffloads) {
  const driver::CurrentContext context;
  Model model(std::vector<std::uint64_t>(8, 10000));
  Reference ref(*model.state);
  ExecutorOptions options;
  options.rates = test_rates();
  Executor executor(*model.state, options);
  auto grads = model.make_gradients(1);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const driver::ContextScope scope(executor.context());
      for (std::size_t i = t; i < 8; i += 4) {
        for (std::uint64_t off = 0; off < 10000; off += 1000) {
          executor.offload().offload(i, off, model.grads[i].get() + 2 * off, 1000, Dtype::kBFloat16,
                                     nullptr);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(executor.offload().offloads(), 80u);
  executor.run(hyper(1), Policy::every(2), kHeadroom);
  ref.step(grads, hyper(1));
  expect_matches(model, ref);
}

// A route to a device buffer sends the gradient there only, or there and to the pinned buffer
// where it is mirrored (KeptGradients::automatic); device_only_gradient() says which.
TEST_F(OffloadTest, MirroredRoutesReachBothBuffers) {
  const driver::CurrentContext context;
  const std::uint64_t n = 4096;
  Model model({n, n, n});
  ExecutorOptions options;
  options.rates = test_rates();
  Executor executor(*model.state, options);
  GradientOffload& o = executor.offload();
  std::vector<driver::DeviceBuffer> kept;
  kept.reserve(2);
  for (int i = 0; i < 2; ++i) kept.emplace_back(n * 2);
  o.route({kept[0].get(), kept[1].get(), 0}, {1, 0, 0});
  EXPECT_EQ(o.device_only_gradient(0), 0u);
  EXPECT_EQ(o.device_only_gradient(1), kept[1].get());
  EXPECT_EQ(o.device_only_gradient(2), 0u);
  for (std::size_t s = 0; s < 3; ++s) std::memset(model.state->grad(s), 0, n * 2);
  const auto grads = model.make_gradients(1);
  model.offload_all(executor);
  o.synchronize_all();
  for (std::size_t s = 0; s < 3; ++s) {
    const bool on_host = s != 1;
    EXPECT_EQ(on_host, 0 == std::memcmp(model.state->grad(s), grads[s].data(), n * 2)) << s;
    if (s == 2) continue;
    std::vector<std::uint16_t> device(n);
    driver::copy_to_host(device.data(), kept[s].get(), n * 2);
    EXPECT_EQ(device, grads[s]) << s;
  }
  EXPECT_THROW(o.route({kept[0].get(), 0, 0}, {1, 0}), std::invalid_argument);
  o.route({});
}

TEST_F(OffloadTest, RejectsBadArguments) {
  const driver::CurrentContext context;
  Model model({100});
  ExecutorOptions options;
  options.rates = test_rates();
  Executor executor(*model.state, options);
  auto& o = executor.offload();
  const CUdeviceptr g = model.grads[0].get();
  EXPECT_THROW(o.offload(1, 0, g, 10, Dtype::kBFloat16, nullptr), std::invalid_argument);
  EXPECT_THROW(o.offload(0, 95, g, 10, Dtype::kBFloat16, nullptr), std::invalid_argument);
  EXPECT_THROW(o.offload(0, 0, g, 0, Dtype::kBFloat16, nullptr), std::invalid_argument);
  EXPECT_THROW(o.offload(0, 0, g, 10, Dtype::kFloat32, nullptr), std::invalid_argument);
  EXPECT_THROW(o.offload(0, 0, 0, 10, Dtype::kBFloat16, nullptr), std::invalid_argument);
  EXPECT_THROW(o.offload(0, 0, g + 1, 10, Dtype::kBFloat16, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace tide::runtime::testing
