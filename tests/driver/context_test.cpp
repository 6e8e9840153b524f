// driver/context.h and driver/stream_pool.h on the stand-in: one retained reference per device
// however many shares, scopes that give the thread its context back, objects destroyed in their
// own context from any thread, and pooled streams that outlive their holders.
#include "driver/context.h"

#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <thread>

#include "driver/cuda_api.h"
#include "driver/error.h"
#include "driver/stream.h"
#include "driver/stream_pool.h"
#include "tests/allocator/device_standin.h"

namespace tide::driver {
namespace {

using allocator::testing::DeviceStandin;

CUcontext current() { return current_context(); }

TEST(PrimaryContextTest, SharesHoldOneReferenceReleasedByTheLast) {
  const DeviceStandin standin;
  const std::uint64_t before = standin.stats().primary_ctx_references;
  std::optional<PrimaryContext> a(std::in_place, 1);  // device 1: nothing else holds it
  EXPECT_EQ(standin.stats().primary_ctx_references, before + 1);
  {
    const PrimaryContext b(1);
    const PrimaryContext c = b;
    EXPECT_EQ(b.get(), a->get());
    EXPECT_EQ(c.device(), 1);
    EXPECT_EQ(standin.stats().primary_ctx_references, before + 1);
  }
  EXPECT_EQ(standin.stats().primary_ctx_references, before + 1);
  a.reset();
  EXPECT_EQ(standin.stats().primary_ctx_references, before);
  EXPECT_EQ(standin.stats().unretained_releases, 0u);
  EXPECT_THROW(PrimaryContext(7), CudaError);
  EXPECT_EQ(standin.stats().primary_ctx_references, before);
}

TEST(ContextScopeTest, GivesTheThreadItsContextBack) {
  const PrimaryContext zero(0);
  const PrimaryContext one(1);
  EXPECT_EQ(current(), nullptr);
  {
    const ContextScope outer(zero);
    EXPECT_EQ(current(), zero.get());
    {
      const ContextScope same(zero);  // already current: nothing pushed
      const ContextScope inner(one);
      EXPECT_EQ(current(), one.get());
    }
    EXPECT_EQ(current(), zero.get());
  }
  EXPECT_EQ(current(), nullptr);
  // A context the caller made current with cuCtxSetCurrent stays, under and after a scope.
  TIDE_CU(cuCtxSetCurrent, one.get());
  {
    const ContextScope scope(zero);
    EXPECT_EQ(current(), zero.get());
  }
  EXPECT_EQ(current(), one.get());
  TIDE_CU(cuCtxSetCurrent, nullptr);
}

TEST(ContextScopeTest, DriverObjectsAreDestroyedInTheirContextFromAnyThread) {
  const DeviceStandin standin;
  const PrimaryContext zero(0);
  std::optional<Stream> stream;
  std::optional<Event> event;
  {
    const ContextScope scope(zero);
    stream.emplace();
    event.emplace();
    event->record(*stream);
  }
  const std::uint64_t without = standin.stats().calls_without_context;
  std::thread([&] {
    stream.reset();  // no context current on this thread
    event.reset();
    EXPECT_EQ(current(), nullptr);
  }).join();
  EXPECT_EQ(standin.stats().calls_without_context, without);
}

TEST(StreamPoolTest, StreamsOutliveTheirHoldersAndComeRoundAgain) {
  const DeviceStandin standin;
  const PrimaryContext zero(0);
  StreamPool& pool = StreamPool::of(zero);
  EXPECT_EQ(&pool, &StreamPool::of(PrimaryContext(0)));
  std::set<CUstream> seen;
  for (std::size_t i = 0; i < StreamPool::kStreams; ++i) {
    seen.insert(pool.next().get());  // no context current here: the pool makes them in its own
  }
  EXPECT_EQ(seen.size(), StreamPool::kStreams);
  EXPECT_EQ(current(), nullptr);
  EXPECT_TRUE(seen.count(pool.next().get()));  // round again
  // Work on a pooled stream after every share of its context but the pool's is gone.
  const CUstream s = pool.next().get();
  const ContextScope scope(zero);
  EXPECT_EQ(cuda().cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(standin.stats().destroyed_stream_uses, 0u);
}

}  // namespace
}  // namespace tide::driver
