// Refinement: measured subgroup times pull the model's rates toward the machine as it runs.
//
// Each observation is an amount (params for updates, bytes for copies) done in some seconds, for
// one rate. The rate moves toward it in log space by a moving average with a clamped step:
//     log r ← log r + w · clamp(log(observed / r), −log m, +log m)
// with w = max(weight, 1/n) for the rate's n-th observation (so the first few average quickly,
// then it becomes an exponential moving average) and m = max_step. One observation, however
// wild, moves a rate by at most a factor m^w (1.5 at first, 1.5^0.2 ≈ 1.08 later with the
// defaults); noise that is symmetric in log space averages out; a run of consistent
// measurements still gets anywhere, m^w per observation.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "planner/plan.h"
#include "planner/rates.h"

namespace tide::planner {

struct RefineOptions {
  double weight = 0.2;    // the moving average's weight of a new observation, in (0, 1]
  double max_step = 1.5;  // the factor one observation can pull toward, > 1
};

// What the executor measured for one subgroup of a plan (seconds; 0 when not measured).
struct SubgroupTiming {
  double cpu_update_s = 0;  // CPU subgroup
  double h2d_s = 0;         // GPU subgroup: copy-in, update kernel, copy-out
  double gpu_update_s = 0;
  double d2h_s = 0;
};

class RateRefiner {
 public:
  // Throws std::invalid_argument for invalid rates or options.
  explicit RateRefiner(const Rates& initial, const RefineOptions& options = {});

  // One measurement: `amount` params (updates) or bytes (copies) in `seconds`. Returns false, and
  // changes nothing, when either is not a finite number > 0 (a timer that did not run).
  bool observe(RateKind kind, double amount, double seconds);

  // A whole update phase: every measured subgroup of `plan`, with the kind the model charges it
  // to: the contended CPU rate for CPU subgroups the plan runs while its GPU side runs, the free
  // rate for those after it (one that straddles the end is skipped); the duplex copy rates in
  // the GPU pipeline's steady state, as in planner/performance_model.h. A copy-in that shared
  // the host-to-GPU link with the CPU subgroups' weight uploads is credited with the uploads'
  // share of it (the model's flow), so that the link's own rate is what is learnt.
  // `timings` is by subgroup index. Returns the number of observations used.
  std::size_t observe_phase(const Plan& plan, const Footprint& footprint,
                            std::span<const SubgroupTiming> timings);

  const Rates& rates() const { return rates_; }
  std::uint64_t observations(RateKind kind) const {
    return counts_[static_cast<std::size_t>(kind)];
  }

 private:
  Rates rates_;
  RefineOptions options_;
  std::array<std::uint64_t, kRateCount> counts_{};
};

}  // namespace tide::planner
