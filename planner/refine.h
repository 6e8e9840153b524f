// Refinement: measured subgroup times pull the model's rates toward the machine as it runs.
//
// Each observation is an amount (params for updates, bytes for copies) done in some seconds, for
// one rate. The rate moves toward it in log space by a moving average with a clamped step:
//     log r ← log r + w · clamp(log(observed / r), −log m, +log m)
// with w = max(weight, 1/n) for the rate's n-th observation (so the first few average quickly,
// then it becomes an exponential moving average) and m = max_step. One observation, however
// wild, moves a rate by at most a factor m^w (1.5 at first, 1.5^0.2 ≈ 1.08 later with the
// defaults); noise that is symmetric in log space averages out; a run of consistent
// measurements still gets anywhere, m^w per observation. A whole phase counts as one observation
// per rate once the rate has seen kFreePhases phases (its subgroups share their disturbances);
// before that, kAgreeingPhases phases in a row that all find the rate far off set it outright.
//
// Host memory bandwidth is not timed by any one subgroup: a phase gives what its CPU subgroups
// and its copies moved through host memory per second (their bytes over their measured times,
// performance_model.h's c + w and a + b). That is a lower bound of the rate, which can only
// raise it, except when, while copies run, the CPU update and both copies fall below
// kSaturatedFraction of their rates in the plan at once: then host memory was full, what moved
// is its contended rate, and the CPU update's and the copies' times count divided by the least
// of the sides' slowdowns (performance_model.h charges a common slowdown to host memory, not to
// them; what one side slowed more is its own rate's). So a host whose memory binds is learnt
// from the first phases that interleave, without a calibration file, in the same clamped steps.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "planner/performance_model.h"
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
  // share of it (the model's flow), so that the link's own rate is what is learnt. A resident
  // subgroup (SubgroupPlan::resident) refines the GPU update's rate only: its copies in, if any,
  // are not the pipeline's. The CPU subgroups timed beside the GPU side also bound the free CPU
  // rate from below (it cannot be slower alone than beside copies).
  // `timings` is by subgroup index. Returns the number of observations used.
  std::size_t observe_phase(const Plan& plan, const Footprint& footprint,
                            std::span<const SubgroupTiming> timings);

  // While copies run in both directions, the CPU update below this fraction of its free rate
  // and both copies below it of their duplex rates: host memory is taken to be what held them
  // back (observe_phase). A smaller fall is the copies' other costs (cores, caches), which the
  // contended CPU rate holds, or one side's own rate being lower than the model has it.
  static constexpr double kSaturatedFraction = 0.8;

  // A phase's subgroups are timed under the same conditions: a disturbance of the host (another
  // process, a burst of page faults) slows many at once. The first phases that time a rate move
  // it as their observations say; after kFreePhases of them, one phase moves each rate by at
  // most max_step^weight (1.08 with the defaults), as one observation would.
  static constexpr std::uint64_t kFreePhases = 5;

  // A phase timing a rate only once or twice (one GPU subgroup a step) moves it by the clamped
  // steps alone, 2.5x over the free phases: a model 1000x off (the stand-in's emulated kernels
  // against the built-in GPU rate) would take a hundred steps. So among the free phases, when
  // kAgreeingPhases in a row each measured the rate beyond max_step on the same side, it is set
  // to the least far of their measurements (each phase's geometric mean): a disturbance would
  // have to last that many phases to move it, and it moves no further than all of them agree.
  static constexpr std::size_t kAgreeingPhases = 3;

  const Rates& rates() const { return rates_; }
  std::uint64_t observations(RateKind kind) const {
    return counts_[static_cast<std::size_t>(kind)];
  }

 private:
  // What one phase moved through host memory, from its measured subgroups.
  struct HostTraffic {
    double free_params = 0;  // CPU subgroups after the GPU side, and their seconds
    double free_s = 0;
    double contended_params = 0;  // CPU subgroups while it ran, their seconds and number
    double contended_s = 0;
    std::size_t contended_subgroups = 0;
    double h2d_bytes = 0;  // the GPU subgroups' copies, and their seconds
    double h2d_s = 0;
    double d2h_bytes = 0;
    double d2h_s = 0;
    double h2d_planned_s = 0;  // the same copies' seconds in the plan
    double d2h_planned_s = 0;
    double moved = 0;        // bytes/s through host memory while both sides ran; 0: unknown
    bool saturated = false;  // both sides fell below kSaturatedFraction of their rates
    double slowdown = 1;     // when saturated: the least of the sides' against the plan
  };
  // observe_phase's observations, before its per-phase bound.
  std::size_t observe_subgroups(const Plan& plan, const Footprint& footprint,
                                std::span<const SubgroupTiming> timings);
  HostTraffic traffic_of(const Plan& plan, const Footprint& footprint,
                         std::span<const SubgroupTiming> timings) const;
  std::size_t observe_host_memory(const HostTraffic& traffic, const Footprint& footprint);
  // Records what the current phase measured for rate `k` (its phase_) among its free phases,
  // and moves the rate when kAgreeingPhases of them agree that it is far off.
  void agree(std::size_t k, std::uint64_t phase);

  // One rate's observations in the current phase, in log space.
  struct PhaseSum {
    double log_sum = 0;
    std::uint64_t count = 0;
  };

  Rates rates_;
  RefineOptions options_;
  std::array<std::uint64_t, kRateCount> counts_{};
  std::array<std::uint64_t, kRateCount> phases_{};  // phases that observed each rate
  std::array<PhaseSum, kRateCount> phase_{};        // reset at each observe_phase
  // The last kAgreeingPhases free phases' measurements of each rate, by phase number modulo.
  std::array<std::array<double, kAgreeingPhases>, kRateCount> recent_{};
};

}  // namespace tide::planner
