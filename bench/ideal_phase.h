// The best update phase any placement could reach with given rates (bench_update_phase,
// bench_node_update): CPU work and copies perfectly overlapped, the host-to-GPU link carrying the
// CPU subgroups' weights (`upload_bytes` per parameter) as well; min over the GPU's share g of
// max(CPU side, copy-in side, copy-out side).
#pragma once

#include <algorithm>

#include "planner/rates.h"

namespace tide::bench {

// `w` parameters, `state_bytes` per parameter each way (12: fp32 state, 8: bf16 moments).
inline double ideal_seconds(double w, double cpu_rate, const planner::Rates& r, double upload_bytes,
                            unsigned state_bytes) {
  const double sb = state_bytes;
  double best = 1e300;
  for (int i = 0; i <= 1000; ++i) {
    const double g = w * i / 1000.0, c = w - g;
    const double t = std::max(
        {c / cpu_rate, ((sb + 2) * g + upload_bytes * c) / r.h2d_duplex, sb * g / r.d2h_duplex});
    best = std::min(best, t);
  }
  return best;
}

}  // namespace tide::bench
