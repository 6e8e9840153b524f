// The stand-in's counters, read through the control API (standin.h).
#pragma once

#include <cstdint>

#include "standin/standin.h"

namespace tide::standin {

// One per counter field of tide_standin_stats, in the same order (the gauges interrupt them).
enum class Counter {
  kDriverCalls,
  kDeviceAllocs,
  kDeviceFrees,
  kMemCreates,
  kMemReleases,
  kCopiesH2D,
  kCopiesD2H,
  kCopiesD2D,
  kBytesH2D,
  kBytesD2H,
  kBytesD2D,
  kMemsets,
  kPageableAsyncCopies,
  kHostRegisters,
  kHostUnregisters,
  kHostAllocs,
  kHostFrees,
  kKernelLaunches,
  kHostFuncs,
  kInjectedFaults,
  // After the gauges in tide_standin_stats.
  kPrimaryCtxRetains,
  kPrimaryCtxReleases,
  kUnretainedReleases,
  kCallsWithoutContext,
  kDestroyedStreamUses,
  // After the last gauge.
  kEventsCreated,
  kEventsDestroyed,
  kCount
};

void count(Counter counter, std::uint64_t n = 1);

// Counters and gauges, as the control API returns them.
tide_standin_stats snapshot();
void reset_counters();

}  // namespace tide::standin
