// Simulated copy bandwidth (TIDE_STANDIN_H2D_GBPS, TIDE_STANDIN_D2H_GBPS).
//
// Each device has one link per direction, as a GPU has one copy engine per direction: copies in
// opposite directions overlap fully (full duplex), copies in the same direction on different
// streams queue for the link, first come first served, so two of them take as long as both one
// after the other. A copy does its memcpy at once and then sleeps until the link would have
// finished it, so that the overlap of copies with other work can be measured on a small host.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace tide::standin {

enum class Direction { kHostToDevice, kDeviceToHost, kDeviceToDevice };

// Bytes per second; 0 means no simulated limit. Device-to-device copies have none.
void set_rate(Direction direction, double bytes_per_s);
double rate(Direction direction);

class Link {
 public:
  using Clock = std::chrono::steady_clock;
  // Books the link for `bytes` at `bytes_per_s` (> 0), from now or when the copies booked before
  // finish; returns when this copy is done.
  Clock::time_point book(std::uint64_t bytes, double bytes_per_s);

 private:
  std::mutex mutex_;
  Clock::time_point free_at_{};
};

}  // namespace tide::standin
