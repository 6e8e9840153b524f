// Export of the memory timeline as Chrome trace JSON (chrome://tracing, ui.perfetto.dev): one
// process per device with a "memory" counter track (live and reserved bytes), a "phases" track
// (forward/backward/update spans with their peaks), an "iterations" track, and instant events for
// marks and out-of-memory failures. Times are microseconds since the first sample.
#pragma once

#include <iosfwd>
#include <optional>
#include <span>
#include <string_view>

#include "allocator/telemetry/headroom.h"
#include "allocator/telemetry/oom_record.h"
#include "allocator/telemetry/telemetry.h"

namespace tide::allocator::telemetry {

struct TimelineExport {
  int device = 0;
  std::span<const Sample> samples;
  std::span<const IterationStats> iterations;
  std::span<const MarkEvent> marks;
  std::span<const OomRecord> ooms;
  std::optional<HeadroomForecast> headroom;
};

void write_chrome_trace(std::ostream& out, const TimelineExport& data);

// Whether `head`, the beginning of a file, is how write_chrome_trace begins: a trace tide wrote,
// which a new one may replace.
bool is_chrome_trace(std::string_view head);

}  // namespace tide::allocator::telemetry
