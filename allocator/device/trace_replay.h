// Runs an allocation-event trace back through a caching allocator: the trace's allocations,
// frees, record_stream calls, marks and cache releases, in order, with the allocator's clock
// following the trace's time so that its telemetry sees the trace's timeline. Used by
// `tide replay`, the benchmark and the tests, on whatever driver tide loaded (the stand-in
// driver on a machine without a GPU).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "allocator/device/caching_allocator.h"
#include "allocator/telemetry/trace.h"
#include "driver/context.h"
#include "driver/stream.h"

namespace tide::allocator::device {

struct ReplayOptions {
  bool trace_time = true;     // the allocator's clock follows the trace (until finish())
  bool record_curve = false;  // keep live and reserved bytes after every event
};

struct ReplayResult {
  std::uint64_t events = 0;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t failed_allocations = 0;  // the allocator returned null (out of memory)
  std::uint64_t unknown_ids = 0;         // frees or record_streams of ids never allocated
  std::uint64_t peak_live = 0;           // allocated bytes (rounded blocks)
  std::uint64_t peak_requested = 0;      // what the trace asked for
  std::uint64_t peak_reserved = 0;
  std::uint64_t device_allocs = 0;  // driver allocation calls during the replay
  // At each iteration-end mark: driver allocation calls and allocations so far.
  std::vector<std::uint64_t> device_allocs_at_end;
  std::vector<std::uint64_t> allocations_at_end;
  std::vector<telemetry::Sample> curve;  // record_curve: after every event
  double seconds = 0;                    // wall time in run()
};

// A replay in steps: run() some events, look at the allocator, run() more; finish() frees what
// the trace left live and gives the allocator its own clock back.
class Replayer {
 public:
  // The allocator's peak statistics are reset.
  Replayer(CachingAllocator& allocator, const ReplayOptions& options = {});
  ~Replayer();
  Replayer(const Replayer&) = delete;
  Replayer& operator=(const Replayer&) = delete;

  void run(std::span<const telemetry::TraceEvent> events);
  ReplayResult finish();
  const ReplayResult& result() const { return result_; }

 private:
  CUstream stream_of(std::uint32_t index);
  struct Live {
    void* ptr;
    std::uint64_t bytes;
    CUstream stream;
  };

  CachingAllocator& allocator_;
  ReplayOptions options_;
  driver::PrimaryContext context_;
  driver::ContextScope scope_;
  std::vector<std::unique_ptr<driver::Stream>> streams_;  // index i -> stream i + 1
  std::unordered_map<std::uint64_t, Live> live_;
  std::uint64_t now_ = 0;
  std::uint64_t device_allocs_before_ = 0;
  bool finished_ = false;
  ReplayResult result_;
};

ReplayResult replay_trace(const telemetry::Trace& trace, CachingAllocator& allocator,
                          const ReplayOptions& options = {});

}  // namespace tide::allocator::device
