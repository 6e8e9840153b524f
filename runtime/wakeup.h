// Wakes an update phase's coordinating thread when something it waits for may have happened: a
// CPU subgroup finished, or a GPU subgroup's copy-out completed (a driver callback). Shared by
// pointer, because a driver callback may run after the phase is over (on the stand-in, a lost
// device's queued work still runs).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace tide::runtime {

class Wakeup {
 public:
  void notify() {
    {
      std::lock_guard lock(mutex_);
      pending_ = true;
    }
    cv_.notify_one();
  }
  // Returns once notify() was called since the last wait, or after `timeout`.
  void wait(std::chrono::microseconds timeout) {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, timeout, [&] { return pending_; });
    pending_ = false;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool pending_ = false;
};

}  // namespace tide::runtime
