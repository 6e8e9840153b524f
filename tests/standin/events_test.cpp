// Events: completion, positions in a stream, timing.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "tests/standin/standin_test.h"

namespace tide::standin::test {
namespace {

using EventsTest = StandinTest;

void sleep_ms(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms)));
}

// Blocks a stream until released.
struct Latch {
  std::mutex mutex;
  std::condition_variable cv;
  bool released = false;
  void release() {
    {
      const std::lock_guard lock(mutex);
      released = true;
    }
    cv.notify_all();
  }
  static void wait(void* p) {
    auto* latch = static_cast<Latch*>(p);
    std::unique_lock lock(latch->mutex);
    latch->cv.wait_for(lock, std::chrono::seconds(5), [&] { return latch->released; });
  }
};

TEST_F(EventsTest, AnEventNeverRecordedIsComplete) {
  Event never;
  EXPECT_EQ(cuEventQuery(never.get()), CUDA_SUCCESS);
  EXPECT_EQ(cuEventSynchronize(never.get()), CUDA_SUCCESS);
  // Waiting on it holds nothing up.
  Stream stream;
  ASSERT_EQ(cuStreamWaitEvent(stream.get(), never.get(), 0), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(stream.get()), CUDA_SUCCESS);
  // But it has no time.
  Event recorded;
  ASSERT_EQ(cuEventRecord(recorded.get(), stream.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuEventSynchronize(recorded.get()), CUDA_SUCCESS);
  float ms = 0;
  EXPECT_EQ(cuEventElapsedTime(&ms, never.get(), recorded.get()), CUDA_ERROR_INVALID_HANDLE);
}

// Counted for tests that hold a component to reusing its events: each successful create and
// destroy, by field and by name; a failed create counts nothing.
TEST_F(EventsTest, CreatesAndDestroysAreCounted) {
  const tide_standin_stats before = stats();
  {
    Event a;
    Event b(CU_EVENT_DISABLE_TIMING);
    const tide_standin_stats during = stats();
    EXPECT_EQ(during.events_created - before.events_created, 2u);
    EXPECT_EQ(during.events_destroyed, before.events_destroyed);
  }
  CUevent bad = nullptr;
  EXPECT_EQ(cuEventCreate(&bad, 0x80u), CUDA_ERROR_INVALID_VALUE);
  const tide_standin_stats after = stats();
  EXPECT_EQ(after.events_created - before.events_created, 2u);
  EXPECT_EQ(after.events_destroyed - before.events_destroyed, 2u);
  std::uint64_t value = 0;
  ASSERT_EQ(tide_standin_stat("events_destroyed", &value), 0);
  EXPECT_EQ(value, after.events_destroyed);
}

TEST_F(EventsTest, RecordCapturesTheStreamsPositionAtTheCall) {
  Stream stream;
  Event event(CU_EVENT_DISABLE_TIMING);
  int ms = 40;
  ASSERT_EQ(cuLaunchHostFunc(stream.get(), sleep_ms, &ms), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(event.get(), stream.get()), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(event.get()), CUDA_ERROR_NOT_READY);
  // Work submitted after the record does not delay the event.
  Latch latch;
  ASSERT_EQ(cuLaunchHostFunc(stream.get(), Latch::wait, &latch), CUDA_SUCCESS);
  ASSERT_EQ(cuEventSynchronize(event.get()), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(event.get()), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(stream.get()), CUDA_ERROR_NOT_READY);
  // Recorded again: the latest record counts.
  ASSERT_EQ(cuEventRecord(event.get(), stream.get()), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(event.get()), CUDA_ERROR_NOT_READY);
  latch.release();
  ASSERT_EQ(cuEventSynchronize(event.get()), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(stream.get()), CUDA_SUCCESS);
}

TEST_F(EventsTest, ElapsedTimeIsHostTimeBetweenCompletions) {
  Stream stream;
  Event start;
  Event end;
  int ms = 60;
  ASSERT_EQ(cuEventRecord(start.get(), stream.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchHostFunc(stream.get(), sleep_ms, &ms), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(end.get(), stream.get()), CUDA_SUCCESS);
  float elapsed = 0;
  EXPECT_EQ(cuEventElapsedTime(&elapsed, start.get(), end.get()), CUDA_ERROR_NOT_READY);
  ASSERT_EQ(cuEventSynchronize(end.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuEventElapsedTime(&elapsed, start.get(), end.get()), CUDA_SUCCESS);
  EXPECT_GE(elapsed, 59.0f);
  EXPECT_LT(elapsed, 2000.0f);
  // Backwards: negative, as in CUDA.
  float backwards = 0;
  ASSERT_EQ(cuEventElapsedTime(&backwards, end.get(), start.get()), CUDA_SUCCESS);
  EXPECT_FLOAT_EQ(backwards, -elapsed);
  EXPECT_EQ(cuEventElapsedTime(nullptr, start.get(), end.get()), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(EventsTest, EventsWithoutTimingHaveNoElapsedTime) {
  Stream stream;
  Event timed;
  Event untimed(CU_EVENT_DISABLE_TIMING);
  ASSERT_EQ(cuEventRecord(timed.get(), stream.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(untimed.get(), stream.get()), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream.get()), CUDA_SUCCESS);
  float ms = 0;
  EXPECT_EQ(cuEventElapsedTime(&ms, timed.get(), untimed.get()), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuEventElapsedTime(&ms, untimed.get(), timed.get()), CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(EventsTest, DestroyingAnEventWithPendingWorkIsFine) {
  Stream stream;
  Latch latch;
  ASSERT_EQ(cuLaunchHostFunc(stream.get(), Latch::wait, &latch), CUDA_SUCCESS);
  CUevent event = nullptr;
  ASSERT_EQ(cuEventCreate(&event, CU_EVENT_DEFAULT), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(event, stream.get()), CUDA_SUCCESS);
  Stream waiter;
  ASSERT_EQ(cuStreamWaitEvent(waiter.get(), event, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventDestroy(event), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(event), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuEventDestroy(event), CUDA_ERROR_INVALID_HANDLE);
  // The wait enqueued before the destroy still holds.
  EXPECT_EQ(cuStreamQuery(waiter.get()), CUDA_ERROR_NOT_READY);
  latch.release();
  ASSERT_EQ(cuStreamSynchronize(waiter.get()), CUDA_SUCCESS);
}

TEST_F(EventsTest, BadArgumentsAreRejected) {
  CUevent event = nullptr;
  EXPECT_EQ(cuEventCreate(&event, 0x40), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuEventCreate(&event, CU_EVENT_INTERPROCESS), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuEventCreate(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuEventRecord(reinterpret_cast<CUevent>(&event), nullptr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuEventSynchronize(reinterpret_cast<CUevent>(&event)), CUDA_ERROR_INVALID_HANDLE);
}

}  // namespace
}  // namespace tide::standin::test
