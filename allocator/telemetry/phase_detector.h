// Iterations and phases from the live-bytes curve alone, for trainers that give no marks.
//
// A training loop's memory curve repeats every iteration: it rises while the forward pass keeps
// activations, falls while the backward pass frees them, stays low through the optimizer update
// and reaches its minimum between iterations. The detector finds the period from the curve's
// autocorrelation, places a boundary at the start of each climb out of a minimum (tracking the
// period from one boundary to the next, so that iterations may vary in length), and splits each
// iteration at its peak (forward → backward) and where the fall reaches the update's floor
// (backward → update).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "allocator/telemetry/telemetry.h"

namespace tide::allocator::telemetry {

struct DetectorOptions {
  int min_iterations = 3;          // fewer periods than this in the samples: no detection
  std::size_t grid_points = 4096;  // the curve is resampled onto this many points
  double min_correlation = 0.3;    // autocorrelation at the period needed to call it periodic
};

// The period in nanoseconds, or 0 when the curve is not periodic enough.
std::uint64_t estimate_period(std::span<const Sample> samples, const DetectorOptions& options = {});

// Iteration boundaries (times at which an iteration starts), oldest first; empty when the curve
// is not periodic enough.
std::vector<std::uint64_t> detect_boundaries(std::span<const Sample> samples,
                                             const DetectorOptions& options = {});

struct PhaseSplit {
  std::uint64_t backward_start_ns = 0;
  std::uint64_t update_start_ns = 0;
};
// Where backward and update start within [start_ns, end_ns).
PhaseSplit split_phases(std::span<const Sample> samples, std::uint64_t start_ns,
                        std::uint64_t end_ns);

// An iteration's statistics from the samples in [start_ns, end_ns): phases split as
// split_phases() says unless `marked` gives them (phase_seen), peaks from the samples.
IterationStats summarize_iteration(std::span<const Sample> samples, std::uint64_t start_ns,
                                   std::uint64_t end_ns, const IterationStats* marked = nullptr);

// Iterations found in the samples, each summarised, with detected = true.
std::vector<IterationStats> detect_iterations(std::span<const Sample> samples,
                                              const DetectorOptions& options = {});

}  // namespace tide::allocator::telemetry
