// Streams: order within a stream, concurrency across streams, the default streams' rules.
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "tests/standin/standin_test.h"

namespace tide::standin::test {
namespace {

using StreamsTest = StandinTest;

// A gate a host function blocks on until the test opens it (or a timeout, so that a wrong
// stand-in fails the test instead of hanging it).
class Gate {
 public:
  void open() {
    {
      const std::lock_guard lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // True if opened in time.
  bool wait(std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return open_; });
  }
  // As a CUhostFn: blocks until opened.
  static void block(void* gate) { static_cast<Gate*>(gate)->wait(); }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

void sleep_ms(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms)));
}

TEST_F(StreamsTest, WorkRunsInSubmissionOrder) {
  Stream stream;
  struct Log {
    std::vector<int> order;  // touched only by the stream's worker until the sync
    int next = 0;
  } log;
  PinnedVector in(1 << 16);
  std::iota(in.vector().begin(), in.vector().end(), std::uint8_t{0});
  PinnedVector out(1 << 16);
  DeviceBuffer buffer(in.size());
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(cuLaunchHostFunc(
                  stream.get(),
                  [](void* p) {
                    auto* l = static_cast<Log*>(p);
                    l->order.push_back(l->next++);
                  },
                  &log),
              CUDA_SUCCESS);
  }
  // Copies ordered after each other: the download sees the upload.
  ASSERT_EQ(cuMemcpyHtoDAsync(buffer.get(), in.data(), in.size(), stream.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoHAsync(out.data(), buffer.get(), out.size(), stream.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
  std::vector<int> expected(100);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(log.order, expected);
  EXPECT_EQ(in.vector(), out.vector());
}

TEST_F(StreamsTest, CopiesInOppositeDirectionsOnTwoStreamsOverlap) {
  // 1 MiB at 5 MB/s: 210 ms each way; one after the other they would take 420 ms. (Small
  // copies at low rates: the sleeps, not the memcpy, set the times, even under TSan.)
  constexpr std::size_t kBytes = 1 << 20;
  const double one = kBytes / 0.005e9;
  ASSERT_EQ(tide_standin_set_bandwidth(0.005, 0.005), 0);
  PinnedVector up(kBytes, 1);
  PinnedVector down(kBytes, 0);
  DeviceBuffer a(kBytes);
  DeviceBuffer b(kBytes);
  ASSERT_EQ(cuMemsetD8Async(b.get(), 2, kBytes, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  Stream s1;
  Stream s2;

  const auto start = Clock::now();
  ASSERT_EQ(cuMemcpyHtoDAsync(a.get(), up.data(), kBytes, s1.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoHAsync(down.data(), b.get(), kBytes, s2.get()), CUDA_SUCCESS);
  const double enqueued = seconds_since(start);
  ASSERT_EQ(cuStreamSynchronize(s1.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(s2.get()), CUDA_SUCCESS);
  const double elapsed = seconds_since(start);

  EXPECT_LT(enqueued, one / 2) << "the async copies did not return at once";
  EXPECT_GE(elapsed, one * 0.95) << "faster than the simulated bandwidth";
  EXPECT_LT(elapsed, 2 * one * 0.75) << "the copies did not overlap";
  EXPECT_EQ(down.vector(), std::vector<std::uint8_t>(kBytes, 2));
  EXPECT_EQ(std::memcmp(reinterpret_cast<void*>(a.get()), up.data(), kBytes), 0);
}

TEST_F(StreamsTest, CopiesInTheSameDirectionShareTheLink) {
  // One copy engine per direction: two uploads on two streams take as long as both in turn.
  constexpr std::size_t kBytes = 1 << 20;  // 105 ms at 10 MB/s
  const double one = kBytes / 0.01e9;
  ASSERT_EQ(tide_standin_set_bandwidth(0.01, 0.01), 0);
  PinnedVector host(kBytes, 1);
  DeviceBuffer a(kBytes);
  DeviceBuffer b(kBytes);
  Stream s1;
  Stream s2;
  const auto start = Clock::now();
  ASSERT_EQ(cuMemcpyHtoDAsync(a.get(), host.data(), kBytes, s1.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyHtoDAsync(b.get(), host.data(), kBytes, s2.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(s1.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(s2.get()), CUDA_SUCCESS);
  EXPECT_GE(seconds_since(start), 2 * one * 0.95);
}

TEST_F(StreamsTest, StreamWaitsForAnEventRecordedAfterSlowWorkOnAnother) {
  constexpr std::size_t kBytes = 1 << 20;  // 105 ms at 10 MB/s
  ASSERT_EQ(tide_standin_set_bandwidth(0.01, 0), 0);
  PinnedVector source(kBytes, 7);
  PinnedVector result(kBytes, 0);
  DeviceBuffer buffer(kBytes);
  ASSERT_EQ(cuMemsetD8Async(buffer.get(), 0, kBytes, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  Stream producer;
  Stream consumer;
  Event uploaded(CU_EVENT_DISABLE_TIMING);
  ASSERT_EQ(cuMemcpyHtoDAsync(buffer.get(), source.data(), kBytes, producer.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(uploaded.get(), producer.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWaitEvent(consumer.get(), uploaded.get(), 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoHAsync(result.data(), buffer.get(), kBytes, consumer.get()), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(consumer.get()), CUDA_ERROR_NOT_READY);
  ASSERT_EQ(cuStreamSynchronize(consumer.get()), CUDA_SUCCESS);
  EXPECT_EQ(result.vector(), source.vector());
  // Waiting did not make the producer wait for the consumer.
  EXPECT_EQ(cuStreamQuery(producer.get()), CUDA_SUCCESS);
}

TEST_F(StreamsTest, LegacyStreamWaitsForBlockingStreamsAndTheyForIt) {
  Stream blocking(CU_STREAM_DEFAULT);
  std::atomic<int> first{0};
  std::atomic<int> seen_by_legacy{-1};
  int ms = 60;
  ASSERT_EQ(cuLaunchHostFunc(blocking.get(), sleep_ms, &ms), CUDA_SUCCESS);
  ASSERT_EQ(
      cuLaunchHostFunc(
          blocking.get(), [](void* p) { static_cast<std::atomic<int>*>(p)->store(1); }, &first),
      CUDA_SUCCESS);
  struct Probe {
    std::atomic<int>* flag;
    std::atomic<int>* seen;
  } legacy_probe{&first, &seen_by_legacy};
  ASSERT_EQ(cuLaunchHostFunc(
                nullptr,
                [](void* p) {
                  auto* probe = static_cast<Probe*>(p);
                  probe->seen->store(probe->flag->load());
                },
                &legacy_probe),
            CUDA_SUCCESS);
  // And the other way: work on the blocking stream waits for the legacy stream's work.
  std::atomic<int> second{0};
  std::atomic<int> seen_by_blocking{-1};
  ASSERT_EQ(cuLaunchHostFunc(CU_STREAM_LEGACY, sleep_ms, &ms), CUDA_SUCCESS);
  ASSERT_EQ(
      cuLaunchHostFunc(
          CU_STREAM_LEGACY, [](void* p) { static_cast<std::atomic<int>*>(p)->store(1); }, &second),
      CUDA_SUCCESS);
  Probe blocking_probe{&second, &seen_by_blocking};
  ASSERT_EQ(cuLaunchHostFunc(
                blocking.get(),
                [](void* p) {
                  auto* probe = static_cast<Probe*>(p);
                  probe->seen->store(probe->flag->load());
                },
                &blocking_probe),
            CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(blocking.get()), CUDA_SUCCESS);
  EXPECT_EQ(seen_by_legacy.load(), 1);
  EXPECT_EQ(seen_by_blocking.load(), 1);
}

TEST_F(StreamsTest, NonBlockingStreamsIgnoreTheLegacyStream) {
  // The legacy stream blocks until work on a non-blocking stream opens the gate: that only
  // finishes if neither waits for the other.
  Stream non_blocking(CU_STREAM_NON_BLOCKING);
  Gate gate;
  struct Check {
    Gate* gate;
    std::atomic<bool> opened_in_time{false};
  } check{&gate};
  ASSERT_EQ(cuLaunchHostFunc(
                nullptr,
                [](void* p) {
                  auto* c = static_cast<Check*>(p);
                  c->opened_in_time = c->gate->wait(std::chrono::seconds(3));
                },
                &check),
            CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchHostFunc(
                non_blocking.get(), [](void* g) { static_cast<Gate*>(g)->open(); }, &gate),
            CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(non_blocking.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(nullptr), CUDA_SUCCESS);
  EXPECT_TRUE(check.opened_in_time);
}

TEST_F(StreamsTest, QueryReportsPendingWork) {
  Stream stream;
  EXPECT_EQ(cuStreamQuery(stream.get()), CUDA_SUCCESS);
  Gate gate;
  ASSERT_EQ(cuLaunchHostFunc(stream.get(), Gate::block, &gate), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(stream.get()), CUDA_ERROR_NOT_READY);
  gate.open();
  ASSERT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(stream.get()), CUDA_SUCCESS);
}

TEST_F(StreamsTest, DestroyReturnsAtOnceAndPendingWorkStillRuns) {
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, CU_STREAM_DEFAULT), CUDA_SUCCESS);
  Gate gate;
  std::atomic<int> ran{0};
  ASSERT_EQ(cuLaunchHostFunc(stream, Gate::block, &gate), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchHostFunc(
                stream, [](void* p) { static_cast<std::atomic<int>*>(p)->store(1); }, &ran),
            CUDA_SUCCESS);
  ASSERT_EQ(cuStreamDestroy(stream), CUDA_SUCCESS);  // would hang here if it waited
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(cuStreamQuery(stream), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuStreamDestroy(stream), CUDA_ERROR_INVALID_HANDLE);
  // The legacy stream still waits for the destroyed stream's work.
  std::atomic<int> seen{-1};
  struct Probe {
    std::atomic<int>* ran;
    std::atomic<int>* seen;
  } probe{&ran, &seen};
  ASSERT_EQ(cuLaunchHostFunc(
                nullptr,
                [](void* p) {
                  auto* pr = static_cast<Probe*>(p);
                  pr->seen->store(pr->ran->load());
                },
                &probe),
            CUDA_SUCCESS);
  gate.open();
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(seen.load(), 1);
}

TEST_F(StreamsTest, BadArgumentsAreRejected) {
  CUstream stream = nullptr;
  EXPECT_EQ(cuStreamCreate(&stream, 0x10), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuStreamCreate(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuStreamDestroy(nullptr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuStreamSynchronize(reinterpret_cast<CUstream>(&stream)), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuLaunchHostFunc(nullptr, nullptr, nullptr), CUDA_ERROR_INVALID_VALUE);
  Event event;
  EXPECT_EQ(cuStreamWaitEvent(nullptr, event.get(), 0x8), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuStreamWaitEvent(nullptr, reinterpret_cast<CUevent>(&stream), 0),
            CUDA_ERROR_INVALID_HANDLE);
}

// A stream's handle is never handed out again, so a use after cuStreamDestroy (undefined in CUDA,
// where the next stream may get the same address) fails and is counted, and a new stream is not
// mistaken for the old one.
TEST_F(StreamsTest, AStreamUsedAfterItsEndIsCounted) {
  CUstream old = nullptr;
  ASSERT_EQ(cuStreamCreate(&old, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamDestroy(old), CUDA_SUCCESS);
  CUstream fresh = nullptr;
  ASSERT_EQ(cuStreamCreate(&fresh, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  EXPECT_NE(fresh, old);
  const std::uint64_t before = stats().destroyed_stream_uses;
  Event event;
  EXPECT_EQ(cuEventRecord(event.get(), old), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuStreamSynchronize(old), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuStreamDestroy(old), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(stats().destroyed_stream_uses, before + 3);
  // A handle that never was a stream is refused too, but is no use after an end.
  EXPECT_EQ(cuStreamSynchronize(reinterpret_cast<CUstream>(&fresh)), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(stats().destroyed_stream_uses, before + 3);
  EXPECT_EQ(cuStreamSynchronize(fresh), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(fresh), CUDA_SUCCESS);
}

TEST_F(StreamsTest, PerThreadDefaultStreamsAreSeparateButBlocking) {
  // Each thread's CU_STREAM_PER_THREAD is its own stream: a blocked one on this thread does not
  // hold up another thread's.
  Gate gate;
  ASSERT_EQ(cuLaunchHostFunc(CU_STREAM_PER_THREAD, Gate::block, &gate), CUDA_SUCCESS);
  std::atomic<bool> other_done{false};
  std::thread other([&] {
    ASSERT_EQ(cuCtxSetCurrent(context_), CUDA_SUCCESS);
    ASSERT_EQ(cuLaunchHostFunc(
                  CU_STREAM_PER_THREAD, [](void*) {}, nullptr),
              CUDA_SUCCESS);
    ASSERT_EQ(cuStreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
    other_done = true;
  });
  other.join();
  EXPECT_TRUE(other_done);
  EXPECT_EQ(cuStreamQuery(CU_STREAM_PER_THREAD), CUDA_ERROR_NOT_READY);
  // Per-thread streams are blocking: the legacy stream waits for them.
  std::atomic<int> after{0};
  ASSERT_EQ(
      cuLaunchHostFunc(
          CU_STREAM_LEGACY, [](void* p) { static_cast<std::atomic<int>*>(p)->store(1); }, &after),
      CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(CU_STREAM_LEGACY), CUDA_ERROR_NOT_READY);
  gate.open();
  ASSERT_EQ(cuStreamSynchronize(CU_STREAM_LEGACY), CUDA_SUCCESS);
  EXPECT_EQ(after.load(), 1);
}

TEST_F(StreamsTest, ManyThreadsSubmitConcurrently) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 40;
  constexpr std::size_t kBytes = 4096;
  DeviceBuffer shared(kThreads * kBytes);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (cuCtxSetCurrent(context_) != CUDA_SUCCESS) ++failures;
      {
        Stream stream(t % 2 == 0 ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT);
        Event done;
        PinnedVector in(kBytes);
        PinnedVector out(kBytes);
        const CUdeviceptr mine = shared.get() + t * kBytes;
        for (int round = 0; round < kRounds; ++round) {
          std::memset(in.data(), round + t, kBytes);
          const bool ok =
              cuMemcpyHtoDAsync(mine, in.data(), kBytes, stream.get()) == CUDA_SUCCESS &&
              cuMemcpyDtoHAsync(out.data(), mine, kBytes, stream.get()) == CUDA_SUCCESS &&
              cuEventRecord(done.get(), stream.get()) == CUDA_SUCCESS &&
              cuEventSynchronize(done.get()) == CUDA_SUCCESS;
          if (!ok || out.vector() != in.vector()) ++failures;
        }
      }  // unregistered while the context is still current
      cuCtxSetCurrent(nullptr);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace tide::standin::test
