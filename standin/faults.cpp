#include "standin/faults.h"

#include <atomic>

#include "standin/init.h"
#include "standin/stats.h"
#include "standin/streams.h"

namespace tide::standin {
namespace {

// A running count of events and the number of the one armed to fail (0: none). The nth event
// from arming is the one whose count reaches `armed`, so arming is relative to the count now.
class Trigger {
 public:
  // Counts one event; true when it is the armed one.
  bool hit() {
    const std::uint64_t n = seen_.fetch_add(1, std::memory_order_relaxed) + 1;
    const std::uint64_t at = armed_.load(std::memory_order_relaxed);
    return at != 0 && n == at;
  }
  // Counts one event; true when it is the armed one or a later one.
  bool reached() {
    const std::uint64_t n = seen_.fetch_add(1, std::memory_order_relaxed) + 1;
    const std::uint64_t at = armed_.load(std::memory_order_relaxed);
    return at != 0 && n >= at;
  }
  // The nth event counted from now.
  void arm(std::uint64_t n) {
    armed_.store(n == 0 ? 0 : seen_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  // The nth event of the process (the environment's knobs count from the start).
  void arm_absolute(std::uint64_t n) { armed_.store(n, std::memory_order_relaxed); }
  // Whether the last event counted was the armed one or a later one.
  bool passed() const {
    const std::uint64_t at = armed_.load(std::memory_order_relaxed);
    return at != 0 && seen_.load(std::memory_order_relaxed) >= at;
  }

 private:
  std::atomic<std::uint64_t> seen_{0};
  std::atomic<std::uint64_t> armed_{0};
};

Trigger& alloc_trigger() {
  static auto* trigger = new Trigger;
  return *trigger;
}

Trigger& copy_trigger() {
  static auto* trigger = new Trigger;
  return *trigger;
}

Trigger& pin_trigger() {
  static auto* trigger = new Trigger;
  return *trigger;
}

Trigger& launch_trigger() {
  static auto* trigger = new Trigger;
  return *trigger;
}

Trigger& call_trigger() {
  static auto* trigger = new Trigger;
  return *trigger;
}

}  // namespace

CUresult enter_uninitialized() {
  count(Counter::kDriverCalls);
  if (in_host_function()) return CUDA_ERROR_NOT_PERMITTED;
  if (call_trigger().reached()) {
    count(Counter::kInjectedFaults);
    return CUDA_ERROR_DEVICE_UNAVAILABLE;
  }
  return CUDA_SUCCESS;
}

CUresult enter() {
  if (CUresult r = enter_uninitialized(); r != CUDA_SUCCESS) return r;
  return initialized() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

bool inject_alloc_failure() {
  if (!alloc_trigger().hit()) return false;
  count(Counter::kInjectedFaults);
  return true;
}

bool inject_pin_failure() {
  if (!pin_trigger().hit()) return false;
  count(Counter::kInjectedFaults);
  return true;
}

bool inject_launch_failure() {
  if (!launch_trigger().hit()) return false;
  count(Counter::kInjectedFaults);
  return true;
}

bool inject_copy_failure() {
  if (!copy_trigger().hit()) return false;
  count(Counter::kInjectedFaults);
  return true;
}

void arm_alloc_failure(std::uint64_t n) { alloc_trigger().arm(n); }
void arm_copy_failure(std::uint64_t n) { copy_trigger().arm(n); }
void arm_device_lost(std::uint64_t n) { call_trigger().arm(n); }
void arm_pin_failure(std::uint64_t n) { pin_trigger().arm(n); }
void arm_launch_failure(std::uint64_t n) { launch_trigger().arm(n); }

void arm_from_environment(std::uint64_t fail_alloc, std::uint64_t fail_copy,
                          std::uint64_t device_lost) {
  alloc_trigger().arm_absolute(fail_alloc);
  copy_trigger().arm_absolute(fail_copy);
  call_trigger().arm_absolute(device_lost);
}

bool device_lost() { return call_trigger().passed(); }

}  // namespace tide::standin
