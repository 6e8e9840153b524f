#include "interpose/event_clock.h"

#include <chrono>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>

namespace tide::interpose {
namespace {

bool invariant_tsc() {
#if defined(__x86_64__)
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      return line.find(" constant_tsc") != std::string::npos &&
             line.find(" nonstop_tsc") != std::string::npos;
    }
  }
#endif
  return false;
}

std::uint64_t read_tsc() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return 0;
#endif
}

// The conversion needs some elapsed time to be precise to a few parts per million.
constexpr std::uint64_t kMinCalibrationNs = 20'000'000;

}  // namespace

std::uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ULL +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

EventClock::EventClock() : tsc_(invariant_tsc()) { restart(); }

void EventClock::restart() {
  origin_ns_ = monotonic_ns();
  origin_ticks_ = tsc_ ? read_tsc() : origin_ns_;
}

double EventClock::ns_per_tick() const {
  if (!tsc_) return 1.0;
  std::uint64_t now_ns = monotonic_ns();
  if (now_ns - origin_ns_ < kMinCalibrationNs) {
    std::this_thread::sleep_for(
        std::chrono::nanoseconds(kMinCalibrationNs - (now_ns - origin_ns_)));
  }
  const std::uint64_t now_ticks = read_tsc();
  now_ns = monotonic_ns();
  if (now_ticks <= origin_ticks_) return 1.0;
  return static_cast<double>(now_ns - origin_ns_) / static_cast<double>(now_ticks - origin_ticks_);
}

std::uint64_t EventClock::to_ns(std::uint64_t ticks, double ns_per_tick) const {
  if (ticks <= origin_ticks_) return 0;
  return static_cast<std::uint64_t>(static_cast<double>(ticks - origin_ticks_) * ns_per_tick);
}

}  // namespace tide::interpose
