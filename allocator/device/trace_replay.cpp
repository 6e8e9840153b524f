#include "allocator/device/trace_replay.h"

#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>

namespace tide::allocator::device {

using telemetry::Mark;
using telemetry::Sample;
using telemetry::Trace;
using telemetry::TraceEvent;
using telemetry::TraceOp;

Replayer::Replayer(CachingAllocator& allocator, const ReplayOptions& options)
    : allocator_(allocator),
      options_(options),
      context_(allocator.device()),
      scope_(context_) {  // streams are created in the allocator's device context
  if (options_.trace_time) allocator_.set_clock([this] { return now_; });
  allocator_.reset_peak_stats();
  device_allocs_before_ = allocator_.stats().num_device_alloc;
}

Replayer::~Replayer() {
  if (!finished_) {
    try {
      finish();
    } catch (const std::exception&) {
      // Destruction must not throw; the allocator still frees its memory when destroyed.
    }
  }
}

CUstream Replayer::stream_of(std::uint32_t index) {
  if (index == 0) return nullptr;
  if (index > telemetry::kMaxTraceStreams) {
    throw std::invalid_argument("trace stream " + std::to_string(index) + ": at most " +
                                std::to_string(telemetry::kMaxTraceStreams) + " streams");
  }
  while (streams_.size() < index) streams_.push_back(std::make_unique<driver::Stream>());
  return streams_[index - 1]->get();
}

void Replayer::run(std::span<const TraceEvent> events) {
  const auto start = std::chrono::steady_clock::now();
  for (const TraceEvent& e : events) {
    now_ = e.t_ns;
    ++result_.events;
    switch (e.op) {
      case TraceOp::kAlloc: {
        const CUstream s = stream_of(e.stream);
        void* p = allocator_.allocate(e.bytes, s);
        ++result_.allocations;
        if (p == nullptr) {
          ++result_.failed_allocations;
        } else {
          live_[e.id] = Live{p, e.bytes, s};
        }
        break;
      }
      case TraceOp::kFree: {
        const auto it = live_.find(e.id);
        if (it == live_.end()) {
          ++result_.unknown_ids;
          break;
        }
        allocator_.deallocate(it->second.ptr, it->second.bytes, it->second.stream);
        live_.erase(it);
        ++result_.frees;
        break;
      }
      case TraceOp::kRecordStream: {
        const auto it = live_.find(e.id);
        if (it == live_.end()) {
          ++result_.unknown_ids;
          break;
        }
        allocator_.record_stream(it->second.ptr, stream_of(e.stream));
        break;
      }
      case TraceOp::kMark:
        allocator_.mark(e.mark);
        if (e.mark == Mark::kIterationEnd) {
          result_.device_allocs_at_end.push_back(allocator_.stats().num_device_alloc -
                                                 device_allocs_before_);
          result_.allocations_at_end.push_back(result_.allocations);
        }
        break;
      case TraceOp::kEmptyCache:
        allocator_.empty_cache();
        break;
    }
    if (options_.record_curve) {
      const CachingAllocator::Usage u = allocator_.usage();
      result_.curve.push_back(Sample{e.t_ns, u.live, u.reserved});
    }
  }
  result_.seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

ReplayResult Replayer::finish() {
  finished_ = true;
  const AllocatorStats after = allocator_.stats();
  result_.peak_live = after.allocated_bytes[kAllPools].peak;
  result_.peak_requested = after.requested_bytes[kAllPools].peak;
  result_.peak_reserved = after.reserved_bytes[kAllPools].peak;
  result_.device_allocs = after.num_device_alloc - device_allocs_before_;
  for (auto& [id, l] : live_) allocator_.deallocate(l.ptr, l.bytes, l.stream);
  live_.clear();
  for (auto& s : streams_) s->synchronize();
  if (options_.trace_time) allocator_.set_clock(nullptr);
  return result_;
}

ReplayResult replay_trace(const Trace& trace, CachingAllocator& allocator,
                          const ReplayOptions& options) {
  Replayer replayer(allocator, options);
  replayer.run(trace.events);
  return replayer.finish();
}

}  // namespace tide::allocator::device
