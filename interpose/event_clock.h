// Timestamps for the memory timeline, taken on every allocation and release.
//
// On x86-64 with an invariant TSC (constant_tsc and nonstop_tsc in /proc/cpuinfo) the clock is
// the TSC, read in a few nanoseconds and converted to nanoseconds only when a trace is written,
// against CLOCK_MONOTONIC over the process's lifetime; elsewhere it is CLOCK_MONOTONIC itself.
#pragma once

#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace tide::interpose {

// CLOCK_MONOTONIC in nanoseconds.
std::uint64_t monotonic_ns();

class EventClock {
 public:
  EventClock();

  // Inline: it is on every allocation's path.
  std::uint64_t now() const {
#if defined(__x86_64__)
    if (tsc_) return __rdtsc();
#endif
    return monotonic_ns();
  }
  // The conversion from ticks, measured now (it may wait up to 20 ms for precision).
  double ns_per_tick() const;
  // Nanoseconds from the clock's origin (its construction, or the last restart) to `ticks`.
  std::uint64_t to_ns(std::uint64_t ticks, double ns_per_tick) const;
  void restart();  // a new origin (fork child)

 private:
  bool tsc_ = false;
  std::uint64_t origin_ticks_ = 0;
  std::uint64_t origin_ns_ = 0;
};

}  // namespace tide::interpose
