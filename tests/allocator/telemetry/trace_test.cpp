// The allocation-event trace: its text format, recording it from an allocator, replaying it.
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "allocator/device/caching_allocator.h"
#include "allocator/device/trace_replay.h"
#include "allocator/telemetry/synthetic_trace.h"
#include "allocator/telemetry/trace.h"
#include "driver/context.h"
#include "driver/stream.h"

namespace tide::allocator::telemetry {
namespace {

using device::AllocatorConfig;
using device::CachingAllocator;
using device::kAllPools;
using device::replay_trace;
using device::ReplayResult;

constexpr std::size_t kMiB = std::size_t{1} << 20;

Trace sample_trace() {
  Trace t;
  t.device = 0;
  t.limit = 1234567;
  auto add = [&](TraceEvent e) { t.events.push_back(e); };
  add({0, TraceOp::kAlloc, 1, 4096, 0, Mark::kIterationEnd});
  add({10, TraceOp::kMark, 0, 0, 0, Mark::kForward});
  add({15, TraceOp::kAlloc, 2, 5 * kMiB, 1, Mark::kIterationEnd});
  add({20, TraceOp::kRecordStream, 2, 0, 2, Mark::kIterationEnd});
  add({30, TraceOp::kFree, 1, 0, 0, Mark::kIterationEnd});
  add({30, TraceOp::kEmptyCache, 0, 0, 0, Mark::kIterationEnd});
  add({40, TraceOp::kMark, 0, 0, 0, Mark::kIterationEnd});
  return t;
}

TEST(TraceFormatTest, WritesAndReadsBack) {
  const Trace t = sample_trace();
  std::ostringstream out;
  write_trace(out, t);
  const std::string text = out.str();
  EXPECT_EQ(text.rfind("tide-trace 1\n", 0), 0u);
  EXPECT_NE(text.find("\n15 alloc 2 5242880 1\n"), std::string::npos);
  EXPECT_NE(text.find("\n20 record 2 2\n"), std::string::npos);
  EXPECT_NE(text.find("\n10 mark forward\n"), std::string::npos);
  EXPECT_NE(text.find("\n40 mark end\n"), std::string::npos);
  EXPECT_NE(text.find("\n30 empty\n"), std::string::npos);
  std::istringstream in(text);
  const Trace back = read_trace(in);
  EXPECT_EQ(back.device, 0);
  EXPECT_EQ(back.limit, 1234567u);
  ASSERT_EQ(back.events.size(), t.events.size());
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    EXPECT_EQ(back.events[i].t_ns, t.events[i].t_ns);
    EXPECT_EQ(back.events[i].op, t.events[i].op);
    EXPECT_EQ(back.events[i].id, t.events[i].id);
    EXPECT_EQ(back.events[i].bytes, t.events[i].bytes);
    EXPECT_EQ(back.events[i].stream, t.events[i].stream);
    if (t.events[i].op == TraceOp::kMark) {
      EXPECT_EQ(back.events[i].mark, t.events[i].mark);
    }
  }
}

TEST(TraceFormatTest, RejectsMalformedTracesNamingTheLine) {
  auto error_of = [](const std::string& text) {
    std::istringstream in(text);
    try {
      read_trace(in, "t.trace");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error_of("alloc 1 2 3\n").find("t.trace:1: not a tide allocation trace"),
            std::string::npos);
  EXPECT_NE(error_of("tide-trace 1\n5 grow 1\n").find("t.trace:2: unknown event 'grow'"),
            std::string::npos);
  EXPECT_NE(
      error_of("tide-trace 1\n5 alloc 1 512 0\n4 free 1\n").find("t.trace:3: time goes backwards"),
      std::string::npos);
  EXPECT_NE(error_of("tide-trace 1\n5 alloc 1 100\n").find("t.trace:2: malformed 'alloc'"),
            std::string::npos);
  EXPECT_NE(error_of("tide-trace 1\n5 free 1 2\n").find("t.trace:2: malformed 'free'"),
            std::string::npos);
  EXPECT_NE(error_of("tide-trace 1\n5 mark lunch\n").find("malformed 'mark'"), std::string::npos);
  EXPECT_NE(error_of("tide-trace 1\nx free 1\n").find("expected a time"), std::string::npos);
  EXPECT_NE(error_of("").find("empty"), std::string::npos);
}

// Hostile numbers and ids: each an error naming the line, none a run that never ends.
TEST(TraceFormatTest, RejectsNumbersOutOfBoundsAndIdsThatAreNotLive) {
  auto error_of = [](const std::string& events) {
    std::istringstream in("tide-trace 1\n" + events);
    try {
      read_trace(in, "t.trace");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(error_of("0 alloc 1 4096 4294967295\n"),
            "t.trace:2: stream '4294967295' is not an integer from 0 to 256");
  EXPECT_EQ(error_of("0 alloc 1 -4096 0\n"),
            "t.trace:2: bytes '-4096' is not an integer from 0 to 281474976710656");
  EXPECT_EQ(error_of("-5 alloc 1 4096 0\n"),
            "t.trace:2: expected a time in nanoseconds, found '-5'");
  EXPECT_EQ(error_of("0 alloc 1 +4096 0\n"),
            "t.trace:2: bytes '+4096' is not an integer from 0 to 281474976710656");
  EXPECT_EQ(error_of("0 alloc 1 4096 0\n1 alloc 1 512 0\n"),
            "t.trace:3: id 1 allocated again (ids name one allocation each)");
  EXPECT_EQ(error_of("0 alloc 1 4096 0\n1 free 1\n2 free 1\n"),
            "t.trace:4: free of id 1, which was freed already");
  EXPECT_EQ(error_of("0 free 7\n"), "t.trace:2: free of id 7, which was never allocated");
  EXPECT_EQ(error_of("0 record 7 1\n"), "t.trace:2: record of id 7, which was never allocated");
  EXPECT_EQ(error_of("0 alloc 0 4096 0\n"), "t.trace:2: id 0: ids start at 1");
  EXPECT_EQ(error_of("device -1\n"),
            "t.trace:2: device ordinal '-1' is not an integer from 0 to 1023");
  EXPECT_EQ(error_of(std::string(5000, '1') + " empty\n"),
            "t.trace:2: line longer than 4096 characters");
  EXPECT_EQ(error_of("0 alloc 1 4096 256\n1 free 1\n"), "(no error)");
}

TEST(TraceRecordingTest, ARecordedTraceReplaysToTheSamePeaks) {
  const driver::CurrentContext context(0);
  driver::Stream side;
  CachingAllocator recorded(0, AllocatorConfig{});
  void* before = recorded.allocate(3 * kMiB, nullptr);  // live when recording starts
  recorded.start_trace(1 << 16);
  std::vector<std::pair<void*, std::size_t>> live;
  for (int i = 0; i < 200; ++i) {
    const std::size_t size = (i % 7 == 0) ? (i + 1) * 100 * 1024 : (i + 1) * 512;
    live.emplace_back(recorded.allocate(size, i % 3 == 0 ? side.get() : nullptr), size);
    if (i % 3 == 0) recorded.record_stream(live.back().first, nullptr);
    if (i % 4 == 3) {
      auto [p, s] = live[static_cast<std::size_t>(i) / 2];
      recorded.deallocate(p, s, (i / 2) % 3 == 0 ? side.get() : nullptr);
      live[static_cast<std::size_t>(i) / 2].first = nullptr;
    }
    if (i % 50 == 49) recorded.mark(Mark::kIterationEnd);
  }
  const std::uint64_t peak = recorded.stats().allocated_bytes[kAllPools].peak;
  const Trace trace = recorded.stop_trace();
  for (std::size_t i = 0; i < live.size(); ++i) {
    if (live[i].first != nullptr) {
      recorded.deallocate(live[i].first, live[i].second, i % 3 == 0 ? side.get() : nullptr);
    }
  }
  recorded.deallocate(before, 3 * kMiB, nullptr);
  side.synchronize();

  EXPECT_EQ(trace.events.front().op, TraceOp::kAlloc);  // the block live at the start
  EXPECT_EQ(trace.events.front().bytes, 3 * kMiB);
  EXPECT_EQ(trace.events.front().t_ns, 0u);
  EXPECT_EQ(trace.dropped, 0u);
  const std::string path = ::testing::TempDir() + "/recorded.trace";
  save_trace(path, trace);
  const Trace loaded = load_trace(path);
  std::remove(path.c_str());
  ASSERT_EQ(loaded.events.size(), trace.events.size());

  CachingAllocator fresh(0, AllocatorConfig{});
  const ReplayResult r = replay_trace(loaded, fresh);
  EXPECT_EQ(r.failed_allocations, 0u);
  EXPECT_EQ(r.unknown_ids, 0u);
  EXPECT_EQ(r.allocations, 201u);
  EXPECT_EQ(r.peak_live, peak);
  EXPECT_EQ(r.allocations_at_end.size(), 4u);
  EXPECT_EQ(fresh.stats().allocated_bytes[kAllPools].current, 0u);  // replay frees what is left
}

TEST(TraceRecordingTest, AFullRecordingStopsCleanly) {
  const driver::CurrentContext context(0);
  CachingAllocator a(0, AllocatorConfig{});
  a.start_trace(3);
  std::vector<void*> ps;
  for (int i = 0; i < 5; ++i) ps.push_back(a.allocate(4096, nullptr));
  for (void* p : ps) a.deallocate(p, 4096, nullptr);
  const Trace t = a.stop_trace();
  EXPECT_EQ(t.events.size(), 3u);
  EXPECT_EQ(t.dropped, 7u);
}

TEST(SyntheticTraceTest, IterationsRepeatWithKnownBoundaries) {
  SyntheticOptions o;
  o.iterations = 4;
  const SyntheticTrace g = generate_transformer_trace(shape_named("gpt2-small"), o);
  ASSERT_EQ(g.iteration_start_ns.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_LT(g.iteration_start_ns[i], g.backward_start_ns[i]);
    EXPECT_LT(g.backward_start_ns[i], g.update_start_ns[i]);
    EXPECT_LT(g.update_start_ns[i], g.update_end_ns[i]);
  }
  EXPECT_GT(g.allocations_per_iteration, 200u);
  EXPECT_THROW(shape_named("gpt-5"), std::invalid_argument);
}

}  // namespace
}  // namespace tide::allocator::telemetry
