#include "allocator/telemetry/telemetry.h"

#include <algorithm>

namespace tide::allocator::telemetry {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kUpdate:
      return "update";
  }
  return "?";
}

const char* mark_name(Mark mark) {
  switch (mark) {
    case Mark::kForward:
      return "forward";
    case Mark::kBackward:
      return "backward";
    case Mark::kUpdate:
      return "update";
    case Mark::kIterationEnd:
      return "end";
  }
  return "?";
}

Telemetry::Telemetry(std::size_t samples, std::uint64_t resolution)
    : resolution_(resolution == 0 ? 1 : resolution),
      samples_(samples),
      marks_(kMarksKept),
      iterations_(kIterationsKept) {}

void Telemetry::sample(const Sample& s) {
  samples_.push(s);
  last_ = s;
}

void Telemetry::track(std::uint64_t live, std::uint64_t reserved) {
  current_.peak_live_all = std::max(current_.peak_live_all, live);
  current_.min_live = std::min(current_.min_live, live);
  if (phase_ >= 0) {
    current_.peak_live[phase_] = std::max(current_.peak_live[phase_], live);
    current_.peak_reserved[phase_] = std::max(current_.peak_reserved[phase_], reserved);
  }
}

void Telemetry::mark(Mark mark, std::uint64_t t_ns, std::uint64_t live, std::uint64_t reserved,
                     std::uint64_t aside) {
  marks_.push(MarkEvent{t_ns, mark});
  sample(Sample{t_ns, live, reserved});
  live -= std::min(live, aside);  // the peaks below leave it out
  auto open = [&] {
    current_ = IterationStats{};
    current_.index = next_index_++;
    current_.start_ns = t_ns;
    current_.peak_live_all = live;
    current_.min_live = live;
    open_ = true;
    phase_ = -1;
  };
  if (!open_) open();
  if (mark == Mark::kIterationEnd) {
    current_.end_ns = t_ns;
    iterations_.push(current_);
    open();  // iterations tile time: the next one starts where this one ends
    return;
  }
  phase_ = static_cast<int>(mark);
  current_.phase_start_ns[phase_] = t_ns;
  current_.phase_seen[phase_] = true;
  current_.peak_live[phase_] = live;
  current_.peak_reserved[phase_] = reserved;
  track(live, reserved);
}

void Telemetry::clear() {
  samples_.clear();
  marks_.clear();
  iterations_.clear();
  open_ = false;
  phase_ = -1;
  current_ = IterationStats{};
  next_index_ = 0;
}

}  // namespace tide::allocator::telemetry
