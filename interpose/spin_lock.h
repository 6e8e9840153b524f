// A small spin lock for the hooks' short critical sections (a hash-table slot, a counter update):
// one locked instruction to take it and a plain store to release it, where a pthread mutex costs
// two locked instructions. It yields after a short spin, so a preempted holder costs a
// reschedule, not a burnt time slice.
#pragma once

#include <sched.h>

#include <atomic>

namespace tide::interpose {

class SpinLock {
 public:
  void lock() noexcept {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      for (int spins = 0; flag_.load(std::memory_order_relaxed); ++spins) {
        if (spins < 64) {
          relax();
        } else {
          sched_yield();
        }
      }
    }
  }

  bool try_lock() noexcept {
    return !flag_.load(std::memory_order_relaxed) &&
           !flag_.exchange(true, std::memory_order_acquire);
  }

  void unlock() noexcept { flag_.store(false, std::memory_order_release); }

 private:
  static void relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  std::atomic<bool> flag_{false};
};

}  // namespace tide::interpose
