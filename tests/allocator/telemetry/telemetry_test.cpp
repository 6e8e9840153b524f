// Telemetry: the timeline, phase marks and per-phase peaks, phase detection on generated
// transformer-shaped traces with known boundaries, and the headroom forecast.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <vector>

#include "allocator/device/caching_allocator.h"
#include "allocator/device/trace_replay.h"
#include "allocator/telemetry/chrome_trace.h"
#include "allocator/telemetry/headroom.h"
#include "allocator/telemetry/phase_detector.h"
#include "allocator/telemetry/synthetic_trace.h"
#include "allocator/telemetry/telemetry.h"
#include "driver/context.h"
#include "tests/allocator/device_standin.h"

namespace tide::allocator::telemetry {
namespace {

using device::AllocatorConfig;
using device::CachingAllocator;
using device::Replayer;
using device::ReplayOptions;

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

TEST(TelemetryTest, MarkedPhasesGetExactPeaks) {
  Telemetry t(1024, 4 * kMiB);
  std::uint64_t now = 0;
  auto at = [&](std::uint64_t live) {
    now += 10;
    t.on_change(live, 100 * kMiB, [&] { return now; });
  };
  t.mark(Mark::kForward, now, 10 * kMiB, 100 * kMiB);
  at(30 * kMiB);
  at(31 * kMiB);  // below the resolution: no sample, but the peak counts
  t.mark(Mark::kBackward, now += 10, 31 * kMiB, 100 * kMiB);
  at(20 * kMiB);
  t.mark(Mark::kUpdate, now += 10, 20 * kMiB, 100 * kMiB);
  at(25 * kMiB);
  at(12 * kMiB);
  t.mark(Mark::kIterationEnd, now += 10, 12 * kMiB, 100 * kMiB);
  const auto its = t.marked_iterations();
  ASSERT_EQ(its.size(), 1u);
  EXPECT_EQ(its[0].peak_live[0], 31 * kMiB);
  EXPECT_EQ(its[0].peak_live[1], 31 * kMiB);  // what forward left
  EXPECT_EQ(its[0].peak_live[2], 25 * kMiB);
  EXPECT_EQ(its[0].peak_live_all, 31 * kMiB);
  EXPECT_EQ(its[0].min_live, 10 * kMiB);
  EXPECT_TRUE(its[0].phase_seen[2]);
  EXPECT_FALSE(its[0].detected);
  // The timeline kept samples for changes of at least the resolution, and one per mark.
  const auto samples = t.samples();
  EXPECT_EQ(std::count_if(samples.begin(), samples.end(),
                          [](const Sample& s) { return s.live == 31 * kMiB; }),
            1);
}

TEST(TelemetryTest, PeaksLeaveOutWhatTheUpdatePhaseTookFromTheHeadroom) {
  Telemetry t(1024, 1);
  std::uint64_t now = 0;
  t.mark(Mark::kUpdate, now, 10 * kMiB, 100 * kMiB);
  // The optimizer's buffers: 40 MiB of the 50 live are set aside.
  t.on_change(
      50 * kMiB, 100 * kMiB, [&] { return now += 10; }, 40 * kMiB);
  t.on_change(
      15 * kMiB, 100 * kMiB, [&] { return now += 10; }, 0);  // freed; 5 MiB more live
  t.mark(Mark::kIterationEnd, now += 10, 15 * kMiB, 100 * kMiB);
  const auto its = t.marked_iterations();
  ASSERT_EQ(its.size(), 1u);
  EXPECT_EQ(its[0].peak_live[2], 15 * kMiB);
  EXPECT_EQ(its[0].peak_live_all, 15 * kMiB);
  // The timeline shows them.
  const auto samples = t.samples();
  EXPECT_TRUE(std::any_of(samples.begin(), samples.end(),
                          [](const Sample& s) { return s.live == 50 * kMiB; }));
  // A phase that starts while they are live starts from what is left without them.
  t.mark(Mark::kUpdate, now += 10, 45 * kMiB, 100 * kMiB, 40 * kMiB);
  t.mark(Mark::kIterationEnd, now += 10, 45 * kMiB, 100 * kMiB, 40 * kMiB);
  EXPECT_EQ(t.marked_iterations().back().peak_live[2], 5 * kMiB);
}

TEST(TelemetryTest, TheRingKeepsTheNewestSamples) {
  Telemetry t(1024, 1);
  for (std::uint64_t i = 1; i <= 5000; ++i) t.on_change(i * 2, 0, [&] { return i; });
  const auto samples = t.samples();
  ASSERT_EQ(samples.size(), 1024u);
  EXPECT_EQ(samples.back().t_ns, 5000u);
  EXPECT_EQ(samples.front().t_ns, 5000u - 1023u);
  EXPECT_EQ(t.samples_dropped(), 5000u - 1024u);
}

// A sawtooth-like training curve: climb, fall, flat update, minimum; period 1000.
std::vector<Sample> sawtooth(int periods) {
  std::vector<Sample> s;
  for (int p = 0; p < periods; ++p) {
    const std::uint64_t base = static_cast<std::uint64_t>(p) * 1000;
    for (std::uint64_t i = 0; i < 40; ++i) s.push_back({base + i * 10, 100 + i * 10, 0});
    for (std::uint64_t i = 0; i < 40; ++i) s.push_back({base + 400 + i * 10, 500 - i * 8, 0});
    for (std::uint64_t i = 0; i < 10; ++i)
      s.push_back({base + 800 + i * 15, 180 + (i % 2) * 30, 0});
    s.push_back({base + 950, 100, 0});
  }
  return s;
}

TEST(PhaseDetectorTest, FindsThePeriodBoundariesAndPhasesOfACurve) {
  const std::vector<Sample> s = sawtooth(10);
  const std::uint64_t period = estimate_period(s);
  EXPECT_NEAR(static_cast<double>(period), 1000.0, 20.0);
  const std::vector<std::uint64_t> b = detect_boundaries(s);
  ASSERT_GE(b.size(), 9u);
  for (std::uint64_t t : b) {
    const std::uint64_t offset = t % 1000;
    EXPECT_TRUE(offset <= 10 || offset >= 990) << t;  // the start of each climb
  }
  const PhaseSplit split = split_phases(s, 3000, 4000);
  EXPECT_EQ(split.backward_start_ns, 3400u);                              // the peak
  EXPECT_NEAR(static_cast<double>(split.update_start_ns), 3790.0, 15.0);  // the fall's floor
}

TEST(PhaseDetectorTest, AFlatCurveHasNoIterations) {
  std::vector<Sample> s;
  for (std::uint64_t i = 0; i < 1000; ++i) s.push_back({i * 100, 5000, 5000});
  EXPECT_EQ(estimate_period(s), 0u);
  EXPECT_TRUE(detect_boundaries(s).empty());
}

TEST(HeadroomTest, ForecastsFromTheHighestRecentUpdatePeakLessTheMargin) {
  std::vector<IterationStats> its(6);
  for (std::size_t i = 0; i < its.size(); ++i) {
    its[i].phase_seen = {true, true, true};
    its[i].peak_live[2] = (10 + i) * kMiB;
  }
  its[5].peak_live[2] = 12 * kMiB;
  HeadroomForecast f = forecast_headroom(its, 100 * kMiB, 0.0, 3, 0);
  EXPECT_EQ(f.update_peak, 14 * kMiB);  // iterations 3..5: max(13, 14, 12)
  EXPECT_EQ(f.headroom, 86 * kMiB);
  EXPECT_EQ(f.iterations, 3);
  f = forecast_headroom(its, 100 * kMiB, 0.05, 3, 0);
  EXPECT_EQ(f.margin, 5 * kMiB);
  EXPECT_EQ(f.headroom, 81 * kMiB);
  f = forecast_headroom({}, 100 * kMiB, 0.0, 3, 70 * kMiB);  // nothing seen: the fallback
  EXPECT_EQ(f.iterations, 0);
  EXPECT_EQ(f.headroom, 30 * kMiB);
  EXPECT_EQ(f.held_headroom, 0u);  // the forward pass's peak is not known yet
}

TEST(HeadroomTest, WhatIsHeldThroughAnIterationFitsAtItsHighestPeak) {
  std::vector<IterationStats> its(4);
  for (std::size_t i = 0; i < its.size(); ++i) {
    its[i].phase_seen = {true, true, true};
    its[i].peak_live[2] = 10 * kMiB;
    its[i].peak_live_all = (40 + i) * kMiB;  // the forward and backward passes' peak
  }
  its[3].peak_live_all = 41 * kMiB;
  const HeadroomForecast f = forecast_headroom(its, 100 * kMiB, 0.05, 3, 0);
  EXPECT_EQ(f.iteration_peak, 42 * kMiB);  // iterations 1..3: max(41, 42, 41)
  EXPECT_EQ(f.held_headroom, 53 * kMiB);   // 100 - 42 - 5
  EXPECT_EQ(f.headroom, 85 * kMiB);        // 100 - 10 - 5
}

// ---- on generated traces, through the allocator on the stand-in driver

class GeneratedTraceTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    capacity_ = standin_.capacity();
    standin_.set_capacity(std::uint64_t{3} << 30);  // room above the peak, but not much
  }
  void TearDown() override { standin_.set_capacity(capacity_); }

  static SyntheticOptions options(bool marks) {
    SyntheticOptions o;
    o.iterations = 30;
    o.marks = marks;
    o.time_jitter = 0.05;
    o.size_jitter = 0.05;
    o.seed = 42;
    return o;
  }
  static AllocatorConfig config() {
    AllocatorConfig c;
    c.headroom_margin = 0.0;
    return c;
  }
  // Events before time t.
  static std::span<const TraceEvent> until(const Trace& trace, std::size_t* from, std::uint64_t t) {
    std::size_t end = *from;
    while (end < trace.events.size() && trace.events[end].t_ns < t) ++end;
    std::span<const TraceEvent> out(trace.events.data() + *from, end - *from);
    *from = end;
    return out;
  }

  driver::CurrentContext context_{0};
  testing::DeviceStandin standin_;
  std::uint64_t capacity_ = 0;
};

TEST_P(GeneratedTraceTest, DetectedBoundariesAreWithinOnePercentOfTheIteration) {
  const SyntheticTrace gen = generate_transformer_trace(shape_named(GetParam()), options(false));
  CachingAllocator a(0, config());
  Replayer replayer(a);
  replayer.run(gen.trace.events);
  const std::vector<IterationStats> its = a.iterations();
  replayer.finish();
  ASSERT_GE(its.size(), 20u);
  std::vector<std::uint64_t> found;
  for (const IterationStats& it : its) {
    EXPECT_TRUE(it.detected);
    found.push_back(it.start_ns);
  }
  found.push_back(its.back().end_ns);
  const auto& truth = gen.iteration_start_ns;
  int checked = 0;
  int close = 0;
  for (std::size_t i = 1; i + 1 < truth.size(); ++i) {  // the first iteration warms up
    const double length = static_cast<double>(truth[i + 1] - truth[i]);
    double best = 1e300;
    for (std::uint64_t b : found) {
      best = std::min(best, std::fabs(static_cast<double>(b) - static_cast<double>(truth[i])));
    }
    ++checked;
    if (best <= 0.01 * length) ++close;
  }
  EXPECT_GE(close, static_cast<int>(std::ceil(0.95 * checked)))
      << close << " of " << checked << " iteration boundaries found within 1%";
}

TEST_P(GeneratedTraceTest, HeadroomForecastIsWithinFivePercentOfTheUpdatePhasesFreeMemory) {
  for (bool marks : {false, true}) {
    const SyntheticTrace gen = generate_transformer_trace(shape_named(GetParam()), options(marks));
    CachingAllocator a(0, config());
    ReplayOptions ro;
    ro.record_curve = true;
    Replayer replayer(a, ro);
    std::size_t next = 0;
    int checked = 0;
    for (std::size_t k = 8; k + 1 < gen.iteration_start_ns.size(); ++k) {
      replayer.run(until(gen.trace, &next, gen.iteration_start_ns[k]));
      const HeadroomForecast f = a.headroom();
      const std::size_t curve_from = replayer.result().curve.size();
      replayer.run(until(gen.trace, &next, gen.iteration_start_ns[k + 1]));
      // What iteration k's update phase actually used.
      std::uint64_t update_peak = 0;
      const auto& curve = replayer.result().curve;
      for (std::size_t i = curve_from; i < curve.size(); ++i) {
        if (curve[i].t_ns >= gen.update_start_ns[k] && curve[i].t_ns <= gen.update_end_ns[k]) {
          update_peak = std::max(update_peak, curve[i].live);
        }
      }
      const double actual_free = static_cast<double>(f.limit - update_peak);
      EXPECT_GT(f.iterations, 0);
      EXPECT_EQ(f.detected, !marks);
      EXPECT_NEAR(static_cast<double>(f.headroom), actual_free, 0.05 * actual_free)
          << "iteration " << k << (marks ? " (marked)" : " (detected)");
      EXPECT_NEAR(static_cast<double>(f.update_peak), static_cast<double>(update_peak),
                  0.05 * static_cast<double>(update_peak))
          << "iteration " << k << (marks ? " (marked)" : " (detected)");
      ++checked;
    }
    EXPECT_GE(checked, 10);
    replayer.finish();
  }
}

std::string shape_test_name(const ::testing::TestParamInfo<const char*>& p) {
  std::string name = p.param;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}
INSTANTIATE_TEST_SUITE_P(Shapes, GeneratedTraceTest, ::testing::Values("gpt-tiny", "gpt2-small"),
                         shape_test_name);

TEST(MarkedTraceTest, PhasePeaksMatchTheCurveExactly) {
  const driver::CurrentContext context(0);
  SyntheticOptions o;
  o.iterations = 5;
  const SyntheticTrace gen = generate_transformer_trace(shape_named("gpt-tiny"), o);
  AllocatorConfig c;
  c.thread_cache_bytes = 0;  // every change goes through the core's telemetry
  CachingAllocator a(0, c);
  ReplayOptions ro;
  ro.record_curve = true;
  Replayer replayer(a, ro);
  replayer.run(gen.trace.events);
  const std::vector<IterationStats> its = a.iterations();
  const std::vector<Sample> curve = replayer.result().curve;
  replayer.finish();
  ASSERT_EQ(its.size(), 5u);
  for (std::size_t k = 0; k < its.size(); ++k) {
    EXPECT_FALSE(its[k].detected);
    const std::uint64_t bounds[4] = {gen.iteration_start_ns[k], gen.backward_start_ns[k],
                                     gen.update_start_ns[k], gen.update_end_ns[k]};
    for (int p = 0; p < kPhaseCount; ++p) {
      EXPECT_EQ(its[k].phase_start_ns[p], bounds[p]);
      std::uint64_t peak = 0;
      for (const Sample& s : curve) {
        if (s.t_ns >= bounds[p] && s.t_ns <= bounds[p + 1]) peak = std::max(peak, s.live);
      }
      EXPECT_EQ(its[k].peak_live[p], peak) << "iteration " << k << " phase " << p;
    }
  }
}

TEST(TimelineExportTest, ChromeTraceHasCountersPhasesAndMarks) {
  const driver::CurrentContext context(0);
  SyntheticOptions o;
  o.iterations = 3;
  const SyntheticTrace gen = generate_transformer_trace(shape_named("gpt-tiny"), o);
  CachingAllocator a(0, AllocatorConfig{});
  Replayer replayer(a);
  replayer.run(gen.trace.events);
  const std::vector<Sample> samples = a.timeline();
  const std::vector<IterationStats> its = a.iterations();
  const std::vector<MarkEvent> marks = a.marks();
  replayer.finish();
  TimelineExport data;
  data.samples = samples;
  data.iterations = its;
  data.marks = marks;
  std::ostringstream out;
  write_chrome_trace(out, data);
  const std::string json = out.str();
  EXPECT_EQ(json.rfind("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", 0), 0u);
  EXPECT_NE(json.find("\"ph\":\"C\",\"name\":\"memory\""), std::string::npos);
  EXPECT_NE(json.find("\"name\":\"forward\""), std::string::npos);
  EXPECT_NE(json.find("\"name\":\"update\""), std::string::npos);
  EXPECT_NE(json.find("\"name\":\"iteration 2\""), std::string::npos);
  EXPECT_NE(json.find("\"name\":\"mark end\""), std::string::npos);
  EXPECT_EQ(json.substr(json.size() - 4), "\n]}\n");
}

}  // namespace
}  // namespace tide::allocator::telemetry
