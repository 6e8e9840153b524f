// The headroom forecast: how many bytes the coming update phase can use safely, and how many
// can be held through a whole iteration.
//
// The update phase of the next iteration is expected to peak as high as the highest update-phase
// peak of the recent iterations (the largest, not the mean: a forecast that is too high only
// costs speed, one that is too low costs an out-of-memory). The headroom is what the memory limit
// leaves above that peak, less a safety margin (a fraction of the limit).
//
// Memory allocated before the forward pass and held until the update phase (a plan's GPU
// subgroups keeping their gradients on the GPU, prepared at zero_grad()) must also fit at the
// forward and backward passes' peak, which is higher: `held_headroom` is what the limit leaves
// above the whole iterations' highest peak, less the margin, and zero before any iteration was
// seen (the forward pass's peak is not known yet).
#pragma once

#include <cstdint>
#include <span>

#include "allocator/telemetry/telemetry.h"

namespace tide::allocator::telemetry {

struct HeadroomForecast {
  std::uint64_t headroom = 0;        // bytes the update phase can use safely
  std::uint64_t update_peak = 0;     // forecast peak live bytes of the update phase
  std::uint64_t held_headroom = 0;   // bytes that can be held through a whole iteration
  std::uint64_t iteration_peak = 0;  // forecast peak live bytes of a whole iteration
  std::uint64_t limit = 0;           // bytes this process may hold on the device
  std::uint64_t margin = 0;          // safety margin, bytes
  int iterations = 0;                // iterations the forecast comes from (0: none seen yet)
  bool detected = false;             // their phases come from the curve, not from marks
};

// From the last `window` iterations with an update phase; with none, `fallback_peak` (e.g. the
// highest live bytes seen) stands for the update's peak.
HeadroomForecast forecast_headroom(std::span<const IterationStats> iterations, std::uint64_t limit,
                                   double margin_fraction, int window, std::uint64_t fallback_peak);

}  // namespace tide::allocator::telemetry
