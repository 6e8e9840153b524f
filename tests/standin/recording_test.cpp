// The recorded timeline (tide_standin_record, tide_standin_recorded) and holds
// (tide_standin_hold, tide_standin_release). Nothing here depends on how fast anything runs: what
// a hold keeps from starting cannot start, whatever the machine's speed.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tests/standin/standin_test.h"

namespace tide::standin::test {
namespace {

void nothing(const tide_standin_grid*, void**) {}

constexpr unsigned kAllKinds =
    TIDE_STANDIN_OP_H2D | TIDE_STANDIN_OP_D2H | TIDE_STANDIN_OP_D2D | TIDE_STANDIN_OP_KERNEL;

// Declared after the buffers and streams a test uses, so that their destruction (cuMemFree waits
// for the device's work) never waits for held work when an assertion ends the test early.
struct ReleaseAtExit {
  ~ReleaseAtExit() { tide_standin_release(kAllKinds, TIDE_STANDIN_RELEASE_ALL); }
};

class RecordingTest : public StandinTest {
 protected:
  void SetUp() override {
    StandinTest::SetUp();
    ASSERT_EQ(tide_standin_register_kernel("standin_test_recorded", nothing, 8), 0);
    ASSERT_EQ(cuModuleLoadData(&module_, "// PTX\n.entry standin_test_recorded(\n"), CUDA_SUCCESS);
  }
  void TearDown() override {
    tide_standin_release(kAllKinds, TIDE_STANDIN_RELEASE_ALL);
    tide_standin_record(0);
    EXPECT_EQ(cuModuleUnload(module_), CUDA_SUCCESS);
    tide_standin_register_kernel("standin_test_recorded", nullptr, 0);
    StandinTest::TearDown();
  }

  static std::vector<tide_standin_op> recorded(std::uint64_t* dropped = nullptr) {
    std::size_t n = 0;
    EXPECT_EQ(tide_standin_recorded(nullptr, 0, &n, nullptr), 0);
    std::vector<tide_standin_op> ops(n);
    EXPECT_EQ(tide_standin_recorded(ops.data(), ops.size(), &n, dropped), 0);
    ops.resize(std::min(n, ops.size()));
    return ops;
  }

  void launch(CUstream stream) {
    CUfunction f = nullptr;
    ASSERT_EQ(cuModuleGetFunction(&f, module_, "standin_test_recorded"), CUDA_SUCCESS);
    std::uint64_t param = 0;
    void* params[] = {&param};
    ASSERT_EQ(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr), CUDA_SUCCESS);
  }

  CUmodule module_ = nullptr;
};

TEST_F(RecordingTest, OffByDefaultAndWhenStopped) {
  DeviceBuffer device(4096);
  PinnedVector host(4096);
  ASSERT_EQ(cuMemcpyHtoD(device.get(), host.data(), host.size()), CUDA_SUCCESS);
  EXPECT_TRUE(recorded().empty());
  ASSERT_EQ(tide_standin_record(16), 0);
  ASSERT_EQ(cuMemcpyHtoD(device.get(), host.data(), host.size()), CUDA_SUCCESS);
  EXPECT_EQ(recorded().size(), 1u);
  ASSERT_EQ(tide_standin_record(0), 0);  // stops, and frees what was recorded
  ASSERT_EQ(cuMemcpyHtoD(device.get(), host.data(), host.size()), CUDA_SUCCESS);
  EXPECT_TRUE(recorded().empty());
}

TEST_F(RecordingTest, RecordsCopiesAndKernelsWithTheirStreamsAddressesAndTimes) {
  // s2's copy touches memory of its own: the two streams run at once, and a copy on one
  // overlapping the other's would be a data race (TSan saw one when it read b and wrote host).
  DeviceBuffer a(4096), b(4096), c(4096);
  PinnedVector host(4096), host2(4096);
  Stream s1, s2;
  ASSERT_EQ(tide_standin_record(64), 0);
  ASSERT_EQ(cuMemcpyHtoDAsync(a.get(), host.data(), 4096, s1.get()), CUDA_SUCCESS);
  launch(s1.get());
  ASSERT_EQ(cuMemcpyDtoDAsync(b.get(), a.get(), 1024, s1.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoHAsync(host2.data(), c.get(), 2048, s2.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(s1.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(s2.get()), CUDA_SUCCESS);
  const std::vector<tide_standin_op> ops = recorded();
  ASSERT_EQ(ops.size(), 4u);
  const auto h = reinterpret_cast<std::uintptr_t>(host.data());
  const auto id1 = reinterpret_cast<std::uintptr_t>(s1.get());
  const auto id2 = reinterpret_cast<std::uintptr_t>(s2.get());
  EXPECT_EQ(ops[0].kind, TIDE_STANDIN_OP_H2D);
  EXPECT_EQ(ops[0].dst, a.get());
  EXPECT_EQ(ops[0].src, h);
  EXPECT_EQ(ops[0].bytes, 4096u);
  EXPECT_EQ(ops[0].stream, id1);
  EXPECT_EQ(ops[1].kind, TIDE_STANDIN_OP_KERNEL);
  EXPECT_STREQ(ops[1].name, "standin_test_recorded");
  EXPECT_EQ(ops[1].stream, id1);
  EXPECT_EQ(ops[1].bytes, 0u);
  EXPECT_EQ(ops[2].kind, TIDE_STANDIN_OP_D2D);
  EXPECT_EQ(ops[2].dst, b.get());
  EXPECT_EQ(ops[2].src, a.get());
  EXPECT_EQ(ops[3].kind, TIDE_STANDIN_OP_D2H);
  EXPECT_EQ(ops[3].dst, reinterpret_cast<std::uintptr_t>(host2.data()));
  EXPECT_EQ(ops[3].src, c.get());
  EXPECT_EQ(ops[3].bytes, 2048u);
  EXPECT_EQ(ops[3].stream, id2);
  for (const tide_standin_op& op : ops) {
    EXPECT_EQ(op.device, 0);
    EXPECT_EQ(op.name[0] == 0, op.kind != TIDE_STANDIN_OP_KERNEL);
    // One clock for every stream and the caller: std::chrono::steady_clock.
    EXPECT_GT(op.submit_ns, 0);
    EXPECT_LE(op.submit_ns, op.start_ns);
    EXPECT_LE(op.start_ns, op.end_ns);
    EXPECT_LE(op.end_ns,
              std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
                  .count());
  }
  // One stream's work, one after the other; submission order.
  EXPECT_LE(ops[0].end_ns, ops[1].start_ns);
  EXPECT_LE(ops[1].end_ns, ops[2].start_ns);
  for (std::size_t i = 1; i < ops.size(); ++i) {
    EXPECT_LE(ops[i - 1].submit_ns, ops[i].submit_ns);
  }
  // A synchronous copy runs on a default stream, another stream than these.
  ASSERT_EQ(cuMemcpyDtoH(host.data(), a.get(), 8), CUDA_SUCCESS);
  const tide_standin_op sync = recorded().back();
  EXPECT_EQ(sync.kind, TIDE_STANDIN_OP_D2H);
  EXPECT_NE(sync.stream, id1);
  EXPECT_NE(sync.stream, id2);
  EXPECT_NE(sync.end_ns, 0);
}

TEST_F(RecordingTest, HoldsAtMostItsCapacityAndCountsTheRest) {
  DeviceBuffer device(64);
  PinnedVector host(64);
  EXPECT_EQ(tide_standin_record(TIDE_STANDIN_RECORD_MAX + 1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(tide_standin_record(3), 0);
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(cuMemcpyHtoD(device.get(), host.data() + i, 1), CUDA_SUCCESS);
  }
  std::uint64_t dropped = 0;
  std::vector<tide_standin_op> ops = recorded(&dropped);
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_EQ(dropped, 2u);
  EXPECT_EQ(ops[2].src, reinterpret_cast<std::uintptr_t>(host.data() + 2));  // the first three
  // A short buffer gets what fits.
  tide_standin_op one{};
  std::size_t n = 0;
  ASSERT_EQ(tide_standin_recorded(&one, 1, &n, nullptr), 0);
  EXPECT_EQ(n, 3u);
  EXPECT_EQ(one.src, reinterpret_cast<std::uintptr_t>(host.data()));
  // Starting again discards the last recording.
  ASSERT_EQ(tide_standin_record(3), 0);
  ops = recorded(&dropped);
  EXPECT_TRUE(ops.empty());
  EXPECT_EQ(dropped, 0u);
  EXPECT_EQ(tide_standin_recorded(nullptr, 1, &n, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(tide_standin_recorded(&one, 1, nullptr, nullptr), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RecordingTest, HeldWorkWaitsOnItsStreamUntilLetThrough) {
  DeviceBuffer device(4096);
  PinnedVector host(4096);
  Stream held, other;
  Event after_first;
  const ReleaseAtExit release;
  ASSERT_EQ(tide_standin_record(64), 0);
  ASSERT_EQ(tide_standin_hold(TIDE_STANDIN_OP_H2D | TIDE_STANDIN_OP_KERNEL), 0);
  // The calls return; their work waits.
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(cuMemcpyHtoDAsync(device.get() + i, host.data(), 1, held.get()), CUDA_SUCCESS);
    if (i == 0) {
      ASSERT_EQ(cuEventRecord(after_first.get(), held.get()), CUDA_SUCCESS);
    }
  }
  launch(other.get());
  // Kinds not held run meanwhile, on other streams and on the held one's device.
  ASSERT_EQ(cuMemcpyDtoHAsync(host.data(), device.get(), 8, other.get()), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(held.get()), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(cuStreamQuery(other.get()), CUDA_ERROR_NOT_READY);  // behind the held kernel
  ASSERT_EQ(tide_standin_release(TIDE_STANDIN_OP_KERNEL, TIDE_STANDIN_RELEASE_ALL), 0);
  ASSERT_EQ(cuStreamSynchronize(other.get()), CUDA_SUCCESS);
  std::vector<tide_standin_op> ops = recorded();
  ASSERT_EQ(ops.size(), 5u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(ops[i].start_ns, 0) << i;
  }
  EXPECT_NE(ops[4].end_ns, 0);
  EXPECT_EQ(cuStreamQuery(held.get()), CUDA_ERROR_NOT_READY);

  // One let through: the next waits again.
  ASSERT_EQ(tide_standin_release(TIDE_STANDIN_OP_H2D, 1), 0);
  ASSERT_EQ(cuEventSynchronize(after_first.get()), CUDA_SUCCESS);
  ops = recorded();
  EXPECT_NE(ops[0].end_ns, 0);
  EXPECT_GT(ops[0].start_ns, ops[4].end_ns);
  EXPECT_EQ(ops[1].start_ns, 0);
  EXPECT_EQ(cuStreamQuery(held.get()), CUDA_ERROR_NOT_READY);

  // The rest.
  ASSERT_EQ(tide_standin_release(TIDE_STANDIN_OP_H2D, TIDE_STANDIN_RELEASE_ALL), 0);
  ASSERT_EQ(cuStreamSynchronize(held.get()), CUDA_SUCCESS);
  ops = recorded();
  EXPECT_LE(ops[0].end_ns, ops[1].start_ns);
  EXPECT_LE(ops[1].end_ns, ops[2].start_ns);
  EXPECT_NE(ops[2].end_ns, 0);
  // No longer held.
  ASSERT_EQ(cuMemcpyHtoD(device.get(), host.data(), 1), CUDA_SUCCESS);
}

// tide_standin_busy: timed work that occupies its stream as a kernel would, and only its stream.
TEST_F(RecordingTest, BusyWorkOccupiesItsStreamForItsDurationAsAKernel) {
  DeviceBuffer device(4096);
  PinnedVector host(4096);
  Stream busy, other;
  Event after_busy;
  const ReleaseAtExit release;
  ASSERT_EQ(tide_standin_record(16), 0);
  ASSERT_EQ(tide_standin_hold(TIDE_STANDIN_OP_KERNEL), 0);
  ASSERT_EQ(tide_standin_busy(busy.get(), 0.02, "layer_forward"), 0);
  ASSERT_EQ(cuEventRecord(after_busy.get(), busy.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyHtoDAsync(device.get(), host.data(), 4096, busy.get()), CUDA_SUCCESS);
  // Held like a kernel: the stream and its event wait, another stream runs meanwhile.
  ASSERT_EQ(cuMemcpyDtoHAsync(host.data(), device.get(), 8, other.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(other.get()), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(after_busy.get()), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(cuStreamQuery(busy.get()), CUDA_ERROR_NOT_READY);
  std::vector<tide_standin_op> ops = recorded();
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_EQ(ops[0].start_ns, 0);
  EXPECT_NE(ops[2].end_ns, 0);

  ASSERT_EQ(tide_standin_release(TIDE_STANDIN_OP_KERNEL, TIDE_STANDIN_RELEASE_ALL), 0);
  ASSERT_EQ(cuStreamSynchronize(busy.get()), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(after_busy.get()), CUDA_SUCCESS);
  ops = recorded();
  EXPECT_EQ(ops[0].kind, TIDE_STANDIN_OP_KERNEL);
  EXPECT_STREQ(ops[0].name, "layer_forward");
  EXPECT_EQ(ops[0].stream, reinterpret_cast<std::uintptr_t>(busy.get()));
  EXPECT_GT(ops[0].start_ns, ops[2].end_ns);  // let through after the other stream's copy
  // It lasts at least its duration (a sleep: never shorter), and the stream's next work starts
  // after it.
  EXPECT_GE(ops[0].end_ns - ops[0].start_ns, 20'000'000);
  EXPECT_LE(ops[0].end_ns, ops[1].start_ns);
  EXPECT_EQ(ops[1].kind, TIDE_STANDIN_OP_H2D);

  // Unnamed: "busy"; zero seconds is fine.
  ASSERT_EQ(tide_standin_busy(busy.get(), 0, nullptr), 0);
  ASSERT_EQ(cuStreamSynchronize(busy.get()), CUDA_SUCCESS);
  EXPECT_STREQ(recorded().back().name, "busy");
}

TEST_F(RecordingTest, BusyWorkRejectsBadDurationsAndStreams) {
  Stream stream;
  for (double seconds : {-1e-9, 3601.0, std::nan(""), HUGE_VAL}) {
    EXPECT_EQ(tide_standin_busy(stream.get(), seconds, "x"), CUDA_ERROR_INVALID_VALUE) << seconds;
  }
  CUstream gone = nullptr;
  ASSERT_EQ(cuStreamCreate(&gone, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamDestroy(gone), CUDA_SUCCESS);
  EXPECT_EQ(tide_standin_busy(gone, 0, "x"), CUDA_ERROR_INVALID_HANDLE);
  // The legacy default stream of the current context.
  EXPECT_EQ(tide_standin_busy(nullptr, 0, "x"), 0);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
}

TEST_F(RecordingTest, HoldsRejectUnknownKinds) {
  EXPECT_EQ(tide_standin_hold(0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(tide_standin_hold(16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(tide_standin_hold(TIDE_STANDIN_OP_H2D | 32), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(tide_standin_release(0, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(tide_standin_release(64, TIDE_STANDIN_RELEASE_ALL), CUDA_ERROR_INVALID_VALUE);
  // Letting through what is not held changes nothing: a later hold holds.
  DeviceBuffer device(64);
  PinnedVector host(64);
  EXPECT_EQ(tide_standin_release(TIDE_STANDIN_OP_D2H, 5), 0);
  ASSERT_EQ(tide_standin_hold(TIDE_STANDIN_OP_D2H), 0);
  Stream stream;
  const ReleaseAtExit release;
  ASSERT_EQ(cuMemcpyDtoHAsync(host.data(), device.get(), 8, stream.get()), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(stream.get()), CUDA_ERROR_NOT_READY);
  ASSERT_EQ(tide_standin_release(TIDE_STANDIN_OP_D2H, TIDE_STANDIN_RELEASE_ALL), 0);
  EXPECT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
}

}  // namespace
}  // namespace tide::standin::test
