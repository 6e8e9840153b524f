// Measuring the performance model's rates on this machine with the real kernels and copies: what
// `tide calibrate` runs, and what the executor's timing tests and the update_phase benchmark use
// to know the rates of the machine they run on.
//
// Each rate is the best of `repeats` timed runs over buffers of `params` parameters (the best,
// not the mean: on a shared machine the noise only ever slows a run down):
//   cpu_update            cpu_adam_step over one pinned subgroup (bf16 gradient and weight copy)
//   cpu_update_contended  the same while host→GPU and GPU→host copies run back to back
//   h2d, d2h              one copy of the state (12 bytes per parameter) from/to pinned memory
//   h2d_duplex, d2h_duplex  both directions at once, on two streams
//   gpu_update            the fused Adam kernel over the subgroup in device memory
// The driver context must be current on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "scheduler/rates.h"

namespace tide::scheduler {

struct MeasureOptions {
  std::uint64_t params = std::uint64_t{1} << 22;  // per buffer: 4 Mi parameters, 48 MiB of state
  int repeats = 3;
  // Called after each rate with its kind and value (progress output); may be empty.
  std::function<void(RateKind, double)> progress;
};

Rates measure_rates(const MeasureOptions& options = {});

}  // namespace tide::scheduler
