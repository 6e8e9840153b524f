#include "allocator/telemetry/headroom.h"

#include <algorithm>
#include <cmath>

namespace tide::allocator::telemetry {

HeadroomForecast forecast_headroom(std::span<const IterationStats> iterations, std::uint64_t limit,
                                   double margin_fraction, int window,
                                   std::uint64_t fallback_peak) {
  HeadroomForecast f;
  f.limit = limit;
  f.margin = static_cast<std::uint64_t>(std::llround(margin_fraction * static_cast<double>(limit)));
  constexpr int kUpdate = static_cast<int>(Phase::kUpdate);
  for (auto it = iterations.rbegin(); it != iterations.rend() && f.iterations < window; ++it) {
    if (!it->phase_seen[kUpdate]) continue;
    f.update_peak = std::max(f.update_peak, it->peak_live[kUpdate]);
    f.iteration_peak = std::max({f.iteration_peak, it->peak_live_all, it->peak_live[kUpdate]});
    f.detected = f.detected || it->detected;
    ++f.iterations;
  }
  if (f.iterations == 0) f.update_peak = fallback_peak;
  const std::uint64_t used = f.update_peak + f.margin;
  f.headroom = limit > used ? limit - used : 0;
  if (f.iterations > 0) {
    const std::uint64_t held = f.iteration_peak + f.margin;
    f.held_headroom = limit > held ? limit - held : 0;
  }
  return f;
}

}  // namespace tide::allocator::telemetry
