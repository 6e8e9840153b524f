#include "standin/stats.h"

#include <array>
#include <atomic>
#include <cstddef>
#include <cstring>

#include "standin/contexts.h"
#include "standin/device_memory.h"
#include "standin/host_memory.h"

namespace tide::standin {
namespace {

constexpr std::size_t kCounters = static_cast<std::size_t>(Counter::kCount);

// Relaxed atomics: counters are statistics, read after the calls they count have returned.
std::array<std::atomic<std::uint64_t>, kCounters>& counters() {
  static auto* values = new std::array<std::atomic<std::uint64_t>, kCounters>{};
  return *values;
}

}  // namespace

void count(Counter counter, std::uint64_t n) {
  counters()[static_cast<std::size_t>(counter)].fetch_add(n, std::memory_order_relaxed);
}

tide_standin_stats snapshot() {
  // The first counters lead tide_standin_stats, in Counter order; the gauges follow them, then
  // the counters added later, then the last gauge.
  constexpr std::size_t kLeading = static_cast<std::size_t>(Counter::kPrimaryCtxRetains);
  static_assert(offsetof(tide_standin_stats, injected_faults) ==
                (kLeading - 1) * sizeof(std::uint64_t));
  static_assert(offsetof(tide_standin_stats, device_bytes_in_use) ==
                kLeading * sizeof(std::uint64_t));
  // The counters between the gauges, and those after the last one.
  constexpr std::size_t kTrailing = static_cast<std::size_t>(Counter::kEventsCreated);
  static_assert(offsetof(tide_standin_stats, destroyed_stream_uses) ==
                offsetof(tide_standin_stats, primary_ctx_retains) +
                    (kTrailing - kLeading - 1) * sizeof(std::uint64_t));
  static_assert(offsetof(tide_standin_stats, events_destroyed) ==
                offsetof(tide_standin_stats, events_created) +
                    (kCounters - kTrailing - 1) * sizeof(std::uint64_t));
  std::uint64_t values[kCounters];
  for (std::size_t i = 0; i < kCounters; ++i) {
    values[i] = counters()[i].load(std::memory_order_relaxed);
  }
  tide_standin_stats stats{};
  std::memcpy(&stats, values, kLeading * sizeof values[0]);
  std::memcpy(&stats.primary_ctx_retains, values + kLeading,
              (kTrailing - kLeading) * sizeof values[0]);
  std::memcpy(&stats.events_created, values + kTrailing,
              (kCounters - kTrailing) * sizeof values[0]);
  const DeviceBytes bytes = device_bytes();
  stats.device_bytes_in_use = bytes.used;
  stats.device_bytes_peak = bytes.peak;
  const PinnedBytes pinned = pinned_bytes();
  stats.registered_host_bytes = pinned.registered;
  stats.host_alloc_bytes = pinned.allocated;
  stats.primary_ctx_references = primary_ctx_references();
  return stats;
}

void reset_counters() {
  for (auto& counter : counters()) counter.store(0, std::memory_order_relaxed);
  reset_device_peak();
}

}  // namespace tide::standin
