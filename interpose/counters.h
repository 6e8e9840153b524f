// The interposer's counters (calls, failures and bytes per entry point, allocations per origin,
// limit refusals), kept per thread so that a hook never pays for a contended atomic: each thread
// adds to its own block with plain loads and stores, and the report sums the blocks.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "interpose/entry_points.h"

namespace tide::interpose {

struct Counters {
  struct PerKind {
    std::uint64_t calls = 0;
    std::uint64_t failures = 0;
    std::uint64_t bytes = 0;        // bytes of the successful calls
    std::uint64_t allocations = 0;  // allocations charged to this entry point (as origin)
    std::uint64_t allocated_bytes = 0;
  };
  std::array<PerKind, kKindCount> kinds{};
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t limit_rejections = 0;
  std::uint64_t limit_rejected_bytes = 0;
  std::uint64_t runtime_fallbacks = 0;

  Counters& operator+=(const Counters& other);
};

// One thread's counters. Written only by its thread; read (by the report) from any thread, hence
// atomics, but updated without read-modify-write instructions.
class ThreadCounters {
 public:
  static void add(std::atomic<std::uint64_t>& counter, std::uint64_t delta) {
    counter.store(counter.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
  }

  struct PerKind {
    std::atomic<std::uint64_t> calls{0};
    std::atomic<std::uint64_t> failures{0};
    std::atomic<std::uint64_t> bytes{0};
    std::atomic<std::uint64_t> allocations{0};
    std::atomic<std::uint64_t> allocated_bytes{0};
  };
  std::array<PerKind, kKindCount> kinds;
  std::atomic<std::uint64_t> allocations{0};
  std::atomic<std::uint64_t> frees{0};
  std::atomic<std::uint64_t> limit_rejections{0};
  std::atomic<std::uint64_t> limit_rejected_bytes{0};
  std::atomic<std::uint64_t> runtime_fallbacks{0};
  ThreadCounters* next = nullptr;

  // The calling thread's block (created on its first use, never freed: a thread's counts outlive
  // it).
  static ThreadCounters& mine();
  // The sum over every thread's block.
  static Counters total();
  // fork child: every block (the parent's threads are gone) starts from zero.
  static void reset_all();

 private:
  void reset();
};

}  // namespace tide::interpose
