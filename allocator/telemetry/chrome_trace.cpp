#include "allocator/telemetry/chrome_trace.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <ostream>
#include <string>

#include "io/json_writer.h"

namespace tide::allocator::telemetry {
namespace {

namespace json = io::json;

// Every trace starts so (is_chrome_trace).
constexpr std::string_view kHeader = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";

constexpr int kPhasesTrack = 1;
constexpr int kIterationsTrack = 2;
constexpr int kEventsTrack = 3;

class Writer {
 public:
  Writer(std::ostream& out, int device, std::uint64_t t0) : out_(out), device_(device), t0_(t0) {
    out_ << kHeader;
  }
  ~Writer() { out_ << "\n]}\n"; }
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Starts an event object with the common fields; the caller appends fields and closes it.
  std::ostream& begin(const char* ph, const std::string& name, int tid, std::uint64_t t_ns) {
    if (!first_) out_ << ",\n";
    first_ = false;
    out_ << "{\"ph\":\"" << ph << "\",\"name\":" << json::quote(name) << ",\"pid\":" << device_
         << ",\"tid\":" << tid << ",\"ts\":" << micros(t_ns);
    return out_;
  }
  std::string micros(std::uint64_t t_ns) const {
    const std::uint64_t d = t_ns > t0_ ? t_ns - t0_ : 0;
    char text[32];
    std::snprintf(text, sizeof text, "%" PRIu64 ".%03" PRIu64, d / 1000, d % 1000);
    return text;
  }
  std::string duration(std::uint64_t from, std::uint64_t to) const {
    return micros(t0_ + (to > from ? to - from : 0));
  }
  void metadata(const char* what, int tid, const std::string& name) {
    if (!first_) out_ << ",\n";
    first_ = false;
    out_ << "{\"ph\":\"M\",\"name\":" << json::quote(what) << ",\"pid\":" << device_
         << ",\"tid\":" << tid << ",\"args\":{\"name\":" << json::quote(name) << "}}";
  }

 private:
  std::ostream& out_;
  int device_;
  std::uint64_t t0_;
  bool first_ = true;
};

}  // namespace

void write_chrome_trace(std::ostream& out, const TimelineExport& data) {
  std::uint64_t t0 = data.samples.empty() ? 0 : data.samples.front().t_ns;
  for (const IterationStats& it : data.iterations) t0 = std::min(t0, it.start_ns);
  Writer w(out, data.device, t0);
  w.metadata("process_name", 0, "tide device " + std::to_string(data.device));
  w.metadata("thread_name", kPhasesTrack, "phases");
  w.metadata("thread_name", kIterationsTrack, "iterations");
  w.metadata("thread_name", kEventsTrack, "marks and out-of-memory");
  for (const Sample& s : data.samples) {
    w.begin("C", "memory", 0, s.t_ns)
        << ",\"args\":{\"live_bytes\":" << s.live << ",\"reserved_bytes\":" << s.reserved << "}}";
  }
  for (const IterationStats& it : data.iterations) {
    w.begin("X", "iteration " + std::to_string(it.index), kIterationsTrack, it.start_ns)
        << ",\"dur\":" << w.duration(it.start_ns, it.end_ns)
        << ",\"args\":{\"peak_live_bytes\":" << it.peak_live_all
        << ",\"min_live_bytes\":" << it.min_live
        << ",\"detected\":" << (it.detected ? "true" : "false") << "}}";
    for (int p = 0; p < kPhaseCount; ++p) {
      if (!it.phase_seen[p]) continue;
      // A phase lasts until the next phase seen, or the iteration's end.
      std::uint64_t end = it.end_ns;
      for (int q = p + 1; q < kPhaseCount; ++q) {
        if (it.phase_seen[q]) {
          end = it.phase_start_ns[q];
          break;
        }
      }
      w.begin("X", phase_name(static_cast<Phase>(p)), kPhasesTrack, it.phase_start_ns[p])
          << ",\"dur\":" << w.duration(it.phase_start_ns[p], end)
          << ",\"args\":{\"iteration\":" << it.index << ",\"peak_live_bytes\":" << it.peak_live[p]
          << ",\"peak_reserved_bytes\":" << it.peak_reserved[p] << "}}";
    }
  }
  for (const MarkEvent& m : data.marks) {
    w.begin("i", std::string("mark ") + mark_name(m.mark), kEventsTrack, m.t_ns) << ",\"s\":\"t\"}";
  }
  for (const OomRecord& o : data.ooms) {
    w.begin("i", "out of memory", kEventsTrack, o.t_ns)
        << ",\"s\":\"p\",\"args\":{\"requested_bytes\":" << o.requested
        << ",\"live_bytes\":" << o.allocated << ",\"reserved_bytes\":" << o.reserved
        << ",\"limit_bytes\":" << o.limit << ",\"device_free_bytes\":" << o.device_free
        << ",\"largest_free_block\":" << o.largest_free_block << "}}";
  }
  if (data.headroom && !data.samples.empty()) {
    const HeadroomForecast& h = *data.headroom;
    w.begin("C", "headroom forecast", 0, data.samples.back().t_ns)
        << ",\"args\":{\"headroom_bytes\":" << h.headroom
        << ",\"update_peak_bytes\":" << h.update_peak << "}}";
  }
}

bool is_chrome_trace(std::string_view head) { return head.starts_with(kHeader); }

}  // namespace tide::allocator::telemetry
