// The caching allocator's telemetry: phase marks, the timeline and its iterations, the headroom
// forecast, the Chrome trace export, and allocation-event traces.
#include <algorithm>
#include <fstream>
#include <stdexcept>
#include <utility>

#include "allocator/device/caching_allocator.h"
#include "allocator/device/caching_allocator_parts.h"
#include "allocator/telemetry/chrome_trace.h"
#include "allocator/telemetry/phase_detector.h"
#include "driver/cuda_api.h"

namespace tide::allocator::device {

using telemetry::HeadroomForecast;
using telemetry::IterationStats;
using telemetry::Mark;
using telemetry::MarkEvent;
using telemetry::Sample;
using telemetry::Trace;

void CachingAllocator::mark(Mark mark) {
  const std::lock_guard lock(mutex_);
  const std::uint64_t t = now_locked();
  telemetry_.mark(mark, t, live_locked(), reserved_locked(), from_headroom_bytes_);
  if (recorder_.active()) recorder_.mark(t, mark);
}

std::vector<Sample> CachingAllocator::timeline() const {
  const std::lock_guard lock(mutex_);
  return telemetry_.samples();
}

std::vector<MarkEvent> CachingAllocator::marks() const {
  const std::lock_guard lock(mutex_);
  return telemetry_.marks();
}

std::vector<IterationStats> CachingAllocator::iterations() const {
  std::vector<Sample> samples;
  std::vector<IterationStats> marked;
  {
    const std::lock_guard lock(mutex_);
    samples = telemetry_.samples();
    marked = telemetry_.marked_iterations();
  }
  if (marked.empty()) return detect_iterations(samples);
  for (IterationStats& it : marked) {
    if (!it.any_phase()) {
      const std::uint64_t index = it.index;
      it = summarize_iteration(samples, it.start_ns, it.end_ns, nullptr);
      it.index = index;
    }
  }
  return marked;
}

HeadroomForecast CachingAllocator::headroom() const {
  std::uint64_t limit = 0;
  std::uint64_t reserved = 0;
  std::uint64_t peak = 0;
  {
    const std::lock_guard lock(mutex_);
    limit = limit_;
    reserved = reserved_locked();
    peak = std::max(peak_allocated_bytes_[kAllPools], live_locked());
  }
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  {
    const driver::ContextScope scope(context_);
    TIDE_CU(cuMemGetInfo, &free_bytes, &total_bytes);
  }
  // What this process may hold: its limit, and no more than it holds plus what the device has
  // free (other processes may use the rest).
  const std::uint64_t effective = std::min<std::uint64_t>(limit, reserved + free_bytes);
  const std::vector<IterationStats> its = iterations();
  return forecast_headroom(its, effective, config_.headroom_margin, config_.headroom_iterations,
                           peak);
}

void CachingAllocator::set_clock(std::function<std::uint64_t()> clock) {
  const std::lock_guard lock(mutex_);
  clock_ = std::move(clock);
}

std::uint64_t CachingAllocator::telemetry_resolution() const {
  const std::lock_guard lock(mutex_);
  return telemetry_.resolution();
}

// ---- allocation-event trace ----

void CachingAllocator::start_trace(std::size_t max_events) {
  tracing_.store(true, std::memory_order_relaxed);  // new frees and allocations skip the caches
  const std::lock_guard lock(mutex_);
  drain_thread_caches_locked();
  const std::uint64_t t = now_locked();
  recorder_.start(t, max_events, device(), limit_);
  // What is live now, as allocations at time 0, oldest address first.
  std::vector<Block*> live;
  allocated_.for_each([&](CUdeviceptr, Block* b) { live.push_back(b); });
  std::sort(live.begin(), live.end(),
            [](const Block* a, const Block* b) { return a->ptr < b->ptr; });
  for (Block* b : live) b->trace_id = recorder_.alloc(t, b->requested, b->stream);
  on_change_locked();
}

Trace CachingAllocator::stop_trace() {
  const std::lock_guard lock(mutex_);
  tracing_.store(false, std::memory_order_relaxed);
  allocated_.for_each([](CUdeviceptr, Block* b) { b->trace_id = 0; });
  return recorder_.stop();
}

void CachingAllocator::export_chrome_trace(const std::string& path) const {
  const std::vector<Sample> samples = timeline();
  const std::vector<IterationStats> its = iterations();
  const std::vector<MarkEvent> mark_events = marks();
  const std::vector<telemetry::OomRecord> oom_records = ooms();
  telemetry::TimelineExport data;
  data.device = device();
  data.samples = samples;
  data.iterations = its;
  data.marks = mark_events;
  data.ooms = oom_records;
  data.headroom = headroom();
  std::ofstream out(path);
  if (!out) throw std::invalid_argument("cannot write the timeline to " + path);
  telemetry::write_chrome_trace(out, data);
  out.flush();
  if (!out) throw std::runtime_error("writing the timeline to " + path + " failed");
}

}  // namespace tide::allocator::device
