// Memory telemetry of one device: the timeline of live and reserved bytes, phase marks, and
// per-phase peaks of each iteration.
//
// The allocator calls on_change() under its lock on every change of live or reserved bytes; it
// is a few comparisons unless the change since the last sample reaches the resolution, and only
// then reads the clock and writes a sample. Peaks of marked phases are exact (they are updated on
// every change); the timeline is exact to within the resolution.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tide::allocator::telemetry {

enum class Phase : std::uint8_t { kForward = 0, kBackward = 1, kUpdate = 2 };
inline constexpr int kPhaseCount = 3;
const char* phase_name(Phase phase);

enum class Mark : std::uint8_t { kForward = 0, kBackward = 1, kUpdate = 2, kIterationEnd = 3 };
const char* mark_name(Mark mark);

struct Sample {
  std::uint64_t t_ns = 0;
  std::uint64_t live = 0;      // bytes in blocks handed out
  std::uint64_t reserved = 0;  // bytes the allocator holds from the driver
};

struct MarkEvent {
  std::uint64_t t_ns = 0;
  Mark mark = Mark::kIterationEnd;
};

// One iteration: [start_ns, end_ns), the start of each phase (when phase_seen) and each phase's
// peaks (of live bytes less those taken out of the headroom, see Telemetry::on_change). `detected`:
// boundaries and/or phases come from the curve, not from marks.
struct IterationStats {
  std::uint64_t index = 0;
  std::uint64_t start_ns = 0;
  std::uint64_t end_ns = 0;
  std::array<std::uint64_t, kPhaseCount> phase_start_ns{};
  std::array<bool, kPhaseCount> phase_seen{};
  std::array<std::uint64_t, kPhaseCount> peak_live{};
  std::array<std::uint64_t, kPhaseCount> peak_reserved{};
  std::uint64_t peak_live_all = 0;  // the whole iteration
  std::uint64_t min_live = 0;
  bool detected = false;
  bool any_phase() const { return phase_seen[0] || phase_seen[1] || phase_seen[2]; }
};

// A bounded ring of T, oldest overwritten first.
template <typename T>
class Ring {
 public:
  explicit Ring(std::size_t capacity) : items_(capacity == 0 ? 1 : capacity) {}
  void push(const T& item) {
    items_[next_] = item;
    next_ = (next_ + 1) % items_.size();
    if (size_ < items_.size()) {
      ++size_;
    } else {
      ++dropped_;
    }
  }
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return items_.size(); }
  std::uint64_t dropped() const { return dropped_; }
  const T& back() const { return items_[(next_ + items_.size() - 1) % items_.size()]; }
  // Oldest first.
  std::vector<T> snapshot() const {
    std::vector<T> out;
    out.reserve(size_);
    const std::size_t first = (next_ + items_.size() - size_) % items_.size();
    for (std::size_t i = 0; i < size_; ++i) out.push_back(items_[(first + i) % items_.size()]);
    return out;
  }
  void clear() {
    size_ = 0;
    next_ = 0;
  }

 private:
  std::vector<T> items_;
  std::size_t next_ = 0;
  std::size_t size_ = 0;
  std::uint64_t dropped_ = 0;
};

class Telemetry {
 public:
  static constexpr std::size_t kIterationsKept = 1024;
  static constexpr std::size_t kMarksKept = 8192;

  Telemetry(std::size_t samples, std::uint64_t resolution);

  // A change of live or reserved bytes; `now` (a callable returning nanoseconds) is called only
  // when a sample is due. `aside`: the part of `live` the update phase's plan took out of the
  // headroom (CachingAllocator::allocate_from_headroom): the samples show it, the peaks leave it
  // out (the headroom is forecast from them, and must not shrink by the plan's own buffers).
  template <typename Now>
  void on_change(std::uint64_t live, std::uint64_t reserved, Now&& now, std::uint64_t aside = 0) {
    if (open_) track(live - std::min(live, aside), reserved);
    const bool moved = live >= last_.live + resolution_ || live + resolution_ <= last_.live ||
                       reserved != last_.reserved;
    if (moved) sample(Sample{now(), live, reserved});
  }
  // Writes a sample now, whatever the change (phase marks, OOM).
  void sample(const Sample& s);

  void mark(Mark mark, std::uint64_t t_ns, std::uint64_t live, std::uint64_t reserved,
            std::uint64_t aside = 0);
  bool has_marks() const { return marks_.size() > 0; }

  std::vector<Sample> samples() const { return samples_.snapshot(); }
  std::uint64_t samples_dropped() const { return samples_.dropped(); }
  std::vector<MarkEvent> marks() const { return marks_.snapshot(); }
  // Iterations closed by an iteration-end mark, oldest first; phases as marked.
  std::vector<IterationStats> marked_iterations() const { return iterations_.snapshot(); }
  std::uint64_t resolution() const { return resolution_; }
  void set_resolution(std::uint64_t bytes) { resolution_ = bytes == 0 ? 1 : bytes; }
  void clear();

 private:
  void track(std::uint64_t live, std::uint64_t reserved);

  std::uint64_t resolution_;
  Ring<Sample> samples_;
  Ring<MarkEvent> marks_;
  Ring<IterationStats> iterations_;
  Sample last_{};
  bool open_ = false;  // an iteration is open (marks seen)
  int phase_ = -1;     // the current marked phase, -1: none
  IterationStats current_{};
  std::uint64_t next_index_ = 0;
};

}  // namespace tide::allocator::telemetry
