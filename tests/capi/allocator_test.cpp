// The device caching allocator's C ABI (the functions PyTorch's CUDAPluggableAllocator calls, and
// the statistics, telemetry and trace functions), on the process-wide allocators. (libtide.so
// itself, with tide_last_error, is exercised by tests/python/test_allocator.py.)
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "capi/status.h"
#include "driver/context.h"
#include "driver/stream.h"
#include "tide/tide.h"

namespace {

constexpr size_t kMiB = size_t{1} << 20;

class AllocatorCapiTest : public ::testing::Test {
 protected:
  tide::driver::CurrentContext context_{0};
};

TEST_F(AllocatorCapiTest, AllocAndFreeAsPyTorchCallsThem) {
  tide::driver::Stream stream;
  void* p = tide_alloc(1000, 0, nullptr);
  void* q = tide_alloc(5 * kMiB, 0, stream.get());
  ASSERT_NE(p, nullptr);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(tide_alloc(0, 0, nullptr), nullptr);
  tide_alloc_stats s = tide_alloc_stats_default();
  ASSERT_EQ(tide_alloc_get_stats(0, &s), TIDE_OK);
  EXPECT_EQ(s.allocated_bytes[0].current, 1024 + 5 * kMiB);
  EXPECT_EQ(s.requested_bytes[0].current, 1000 + 5 * kMiB);
  EXPECT_EQ(s.allocation[1].current, 1u);
  EXPECT_EQ(s.allocation[2].current, 1u);
  tide_free(p, 1000, 0, nullptr);
  EXPECT_EQ(tide_alloc(1000, 0, nullptr), p);  // from this thread's cache
  ASSERT_EQ(tide_alloc_get_stats(0, &s), TIDE_OK);
  EXPECT_EQ(s.allocation[1].allocated, 2u);
  EXPECT_EQ(s.thread_cache_hits, 1u);
  tide_free(p, 1000, 0, nullptr);
  tide_free(q, 5 * kMiB, 0, stream.get());
  tide_free(nullptr, 0, 0, nullptr);
  ASSERT_EQ(tide_alloc_get_stats(0, &s), TIDE_OK);
  EXPECT_EQ(s.allocated_bytes[0].current, 0u);
  EXPECT_EQ(s.allocated_bytes[0].peak, 1024 + 5 * kMiB);
  ASSERT_EQ(tide_alloc_reset_peak_stats(0), TIDE_OK);
  ASSERT_EQ(tide_alloc_get_stats(0, &s), TIDE_OK);
  EXPECT_EQ(s.allocated_bytes[0].peak, 0u);
  ASSERT_EQ(tide_alloc_empty_cache(-1), TIDE_OK);
  ASSERT_EQ(tide_alloc_get_stats(0, &s), TIDE_OK);
  EXPECT_EQ(s.reserved_bytes[0].current, 0u);
  stream.synchronize();
}

TEST_F(AllocatorCapiTest, OutOfMemoryIsNullWithAMessageAndARecord) {
  const size_t total = tide::driver::memory_info().total_bytes;
  EXPECT_EQ(tide_alloc(2 * total, 0, nullptr), nullptr);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("out of memory on device 0"),
            std::string::npos);
  tide_alloc_oom oom = tide_alloc_oom_default();
  int found = 0;
  ASSERT_EQ(tide_alloc_last_oom(0, &oom, &found), TIDE_OK);
  EXPECT_EQ(found, 1);
  EXPECT_EQ(oom.requested_bytes, 2 * total);
  tide_alloc_stats s = tide_alloc_stats_default();
  ASSERT_EQ(tide_alloc_get_stats(0, &s), TIDE_OK);
  EXPECT_GE(s.num_ooms, 1u);
}

TEST_F(AllocatorCapiTest, BadArgumentsAreInvalidArgumentErrors) {
  EXPECT_EQ(tide_alloc_mark_phase(0, 7), TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("phase"), std::string::npos);
  EXPECT_EQ(tide_alloc_get_stats(0, nullptr), TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tide_alloc_get_stats(99, nullptr), TIDE_ERROR_INVALID_ARGUMENT);
  tide_alloc_stats s = tide_alloc_stats_default();
  EXPECT_EQ(tide_alloc_get_stats(63, &s), TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("no device 63"), std::string::npos);
  EXPECT_EQ(tide_alloc_set_memory_fraction(0, 0.0), TIDE_ERROR_INVALID_ARGUMENT);
  int dummy = 0;
  EXPECT_EQ(tide_alloc_record_stream(&dummy, nullptr), TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tide_alloc_trace_start(0, 0), TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tide_alloc_empty_cache(-2), TIDE_ERROR_INVALID_ARGUMENT);
}

TEST_F(AllocatorCapiTest, HooksServePyTorchsOptionalCalls) {
  tide_alloc_hook_init(1);
  void* p = tide_alloc(4 * kMiB, 0, nullptr);
  tide::driver::Stream other;
  tide_alloc_hook_record_stream(p, other.get());
  tide_free(p, 4 * kMiB, 0, nullptr);
  tide_alloc_stats s = tide_alloc_stats_default();
  ASSERT_EQ(tide_alloc_get_stats(0, &s), TIDE_OK);
  EXPECT_EQ(s.active_bytes[0].current, 4 * kMiB);  // awaiting the other stream's event
  other.synchronize();
  tide_alloc_hook_reset();
  ASSERT_EQ(tide_alloc_get_stats(0, &s), TIDE_OK);
  EXPECT_EQ(s.active_bytes[0].current, 0u);
  EXPECT_EQ(s.reserved_bytes[0].current, 0u);
  tide_alloc_hook_memory_fraction(0.5, 0);
  ASSERT_EQ(tide_alloc_get_stats(0, &s), TIDE_OK);
  EXPECT_EQ(s.memory_limit, tide::driver::memory_info().total_bytes / 2);
  tide_alloc_hook_memory_fraction(1.0, 0);
}

TEST_F(AllocatorCapiTest, PhasesTimelineHeadroomAndExports) {
  for (int it = 0; it < 4; ++it) {
    ASSERT_EQ(tide_alloc_mark_phase(-1, TIDE_PHASE_FORWARD), TIDE_OK);
    std::vector<void*> acts;
    for (int i = 0; i < 8; ++i) acts.push_back(tide_alloc(8 * kMiB, 0, nullptr));
    ASSERT_EQ(tide_alloc_mark_phase(0, TIDE_PHASE_BACKWARD), TIDE_OK);
    for (void* a : acts) tide_free(a, 8 * kMiB, 0, nullptr);
    ASSERT_EQ(tide_alloc_mark_phase(0, TIDE_PHASE_UPDATE), TIDE_OK);
    void* u = tide_alloc(16 * kMiB, 0, nullptr);
    tide_free(u, 16 * kMiB, 0, nullptr);
    ASSERT_EQ(tide_alloc_mark_phase(0, TIDE_PHASE_ITERATION_END), TIDE_OK);
  }
  size_t count = 0;
  ASSERT_EQ(tide_alloc_iterations(0, nullptr, 0, &count), TIDE_OK);
  ASSERT_GE(count, 4u);
  std::vector<tide_alloc_iteration> its(count);
  ASSERT_EQ(tide_alloc_iterations(0, its.data(), its.size(), &count), TIDE_OK);
  const tide_alloc_iteration& last = its.back();
  EXPECT_EQ(last.phase_seen, 7u);
  EXPECT_EQ(last.detected, 0u);
  EXPECT_EQ(last.peak_live_bytes[0], 64 * kMiB);
  EXPECT_EQ(last.peak_live_bytes[2], 16 * kMiB);
  tide_alloc_forecast f = tide_alloc_forecast_default();
  ASSERT_EQ(tide_alloc_headroom(0, &f), TIDE_OK);
  EXPECT_EQ(f.update_peak_bytes, 16 * kMiB);
  EXPECT_EQ(f.headroom_bytes, f.limit_bytes - f.update_peak_bytes - f.margin_bytes);
  EXPECT_EQ(f.iteration_peak_bytes, 64 * kMiB);  // the forward pass's
  EXPECT_EQ(f.held_headroom_bytes, f.limit_bytes - f.iteration_peak_bytes - f.margin_bytes);
  std::vector<tide_alloc_sample> samples(16);
  ASSERT_EQ(tide_alloc_timeline(0, samples.data(), samples.size(), &count), TIDE_OK);
  EXPECT_EQ(count, 16u);
  EXPECT_LE(samples.front().t_ns, samples.back().t_ns);

  const std::string timeline = ::testing::TempDir() + "/timeline.json";
  ASSERT_EQ(tide_alloc_export_timeline(0, timeline.c_str()), TIDE_OK);
  std::ifstream in(timeline);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("\"name\":\"update\""), std::string::npos);
  std::remove(timeline.c_str());

  const std::string trace = ::testing::TempDir() + "/events.trace";
  ASSERT_EQ(tide_alloc_trace_start(0, 1000), TIDE_OK);
  void* p = tide_alloc(12345, 0, nullptr);
  tide_free(p, 12345, 0, nullptr);
  ASSERT_EQ(tide_alloc_trace_stop(0, trace.c_str()), TIDE_OK);
  std::ifstream trace_in(trace);
  std::stringstream trace_text;
  trace_text << trace_in.rdbuf();
  EXPECT_NE(trace_text.str().find(" alloc 1 12345 0\n"), std::string::npos);
  EXPECT_NE(trace_text.str().find(" free 1\n"), std::string::npos);
  std::remove(trace.c_str());
}

}  // namespace
