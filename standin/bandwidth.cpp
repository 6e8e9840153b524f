#include "standin/bandwidth.h"

#include <algorithm>
#include <atomic>

namespace tide::standin {
namespace {

std::atomic<double> g_h2d_rate{0};
std::atomic<double> g_d2h_rate{0};

}  // namespace

void set_rate(Direction direction, double bytes_per_s) {
  if (direction == Direction::kHostToDevice) g_h2d_rate.store(bytes_per_s);
  if (direction == Direction::kDeviceToHost) g_d2h_rate.store(bytes_per_s);
}

double rate(Direction direction) {
  switch (direction) {
    case Direction::kHostToDevice:
      return g_h2d_rate.load();
    case Direction::kDeviceToHost:
      return g_d2h_rate.load();
    case Direction::kDeviceToDevice:
      break;
  }
  return 0;
}

Link::Clock::time_point Link::book(std::uint64_t bytes, double bytes_per_s) {
  const auto duration = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(static_cast<double>(bytes) / bytes_per_s));
  const std::lock_guard lock(mutex_);
  const Clock::time_point start = std::max(Clock::now(), free_at_);
  free_at_ = start + duration;
  return free_at_;
}

}  // namespace tide::standin
