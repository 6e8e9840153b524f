// The allocation-event trace: what a program asked of the allocator, in order, in a text format
// that a replayer (`tide replay`, bench_allocator) runs back through the allocator.
//
// Format (one event per line; '#' starts a comment line; fields separated by one space):
//
//   tide-trace 1                    first line: format name and version
//   device <ordinal>                the device the trace was recorded on
//   limit <bytes>                   the allocator's memory limit when recording started
//   <t_ns> alloc <id> <bytes> <stream>
//   <t_ns> free <id>
//   <t_ns> record <id> <stream>     record_stream: block <id> used on <stream>
//   <t_ns> mark forward|backward|update|end
//   <t_ns> empty                    empty_cache
//
// t_ns: nanoseconds since recording started, non-decreasing. id: a positive integer naming one
// allocation from its alloc to its free (ids are not reused). stream: 0 for the default (null)
// stream, 1, 2, ... for the other streams in the order they first appear. Blocks live when
// recording starts appear as alloc events at t_ns 0.
//
// Bounds (a trace is an input: none may make a replay run away): every number is an unsigned
// decimal integer; at most kMaxTraceStreams streams, kMaxTraceBytes per allocation,
// kMaxTraceEvents events, lines of kMaxTraceLine characters. A free or record of an id that is
// not live, and an id allocated twice, make the trace malformed.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "allocator/telemetry/telemetry.h"

namespace tide::allocator::telemetry {

inline constexpr std::uint64_t kMaxTraceStreams = 256;
inline constexpr std::uint64_t kMaxTraceBytes = std::uint64_t{1} << 48;  // 256 TiB
inline constexpr std::size_t kMaxTraceEvents = std::size_t{1} << 26;
inline constexpr std::size_t kMaxTraceLine = 4096;
inline constexpr std::uint64_t kMaxTraceDevice = 1023;

enum class TraceOp : std::uint8_t { kAlloc, kFree, kRecordStream, kMark, kEmptyCache };

struct TraceEvent {
  std::uint64_t t_ns = 0;
  TraceOp op = TraceOp::kAlloc;
  std::uint64_t id = 0;
  std::uint64_t bytes = 0;
  std::uint32_t stream = 0;
  Mark mark = Mark::kIterationEnd;
};

struct Trace {
  int device = 0;
  std::uint64_t limit = 0;
  std::vector<TraceEvent> events;
  std::uint64_t dropped = 0;  // events not recorded (the recording was full); not written
};

void write_trace(std::ostream& out, const Trace& trace);
// Throws std::invalid_argument naming `source` and the line for a malformed trace.
Trace read_trace(std::istream& in, const std::string& source = "trace");
void save_trace(const std::string& path, const Trace& trace);
Trace load_trace(const std::string& path);

// Records the events of one allocator (called under its lock).
class TraceRecorder {
 public:
  void start(std::uint64_t now_ns, std::size_t max_events, int device, std::uint64_t limit);
  bool active() const { return active_; }
  // Each returns the id given to / used by the block.
  std::uint64_t alloc(std::uint64_t now_ns, std::uint64_t bytes, CUstream stream);
  void free(std::uint64_t now_ns, std::uint64_t id);
  void record_stream(std::uint64_t now_ns, std::uint64_t id, CUstream stream);
  void mark(std::uint64_t now_ns, Mark mark);
  void empty_cache(std::uint64_t now_ns);
  Trace stop();

 private:
  std::uint32_t stream_index(CUstream stream);
  void push(const TraceEvent& event);
  std::uint64_t since(std::uint64_t now_ns) const { return now_ns > t0_ ? now_ns - t0_ : 0; }

  bool active_ = false;
  std::uint64_t t0_ = 0;
  std::size_t max_events_ = 0;
  std::uint64_t next_id_ = 1;
  std::vector<CUstream> streams_;
  Trace trace_;
};

}  // namespace tide::allocator::telemetry
