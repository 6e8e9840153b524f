// The per-iteration planner: the placement with the least predicted update-phase time (see the
// model in planner/performance_model.h) whose buffers and kept gradients fit in the headroom.
//
// What it searches, and why that is enough:
// - The model's time depends on a placement only through the multiset of GPU subgroup sizes, their
//   order in the GPU pipeline, and the buffer count D: the CPU side (and the weight uploads it
//   puts on the host-to-GPU link, and the bytes both sides move through host memory) sees only
//   its total, and subgroups of equal size are
//   interchangeable. So subgroups are grouped by size, and a candidate
//   is a count per size.
// - For a fixed GPU order, the phase time is non-increasing in D from D = 2 up (more buffers only
//   relax the pipeline), and D = 1 runs the copies alone at their own rates, so the best D is 1 or
//   the most that fit; the planner keeps the smallest D that reaches that time.
// - Exact search: when the subgroups have few distinct sizes (tide splits parameters evenly, so
//   one size plus a remainder) or are few, every count vector and every distinct GPU order is
//   tried (bounded by PlannerOptions; with 50 equal subgroups that is 51 candidates). The plan is
//   then optimal under the model and Plan::optimal says so.
// - Otherwise: if the multisets are few enough, every one is tried with a few ordering rules
//   (smallest first, smallest last, a pyramid, ...); if not (many distinct sizes), GPU sets are
//   windows of the subgroups sorted by size (every count and start, on a grid when there are
//   more than 64 subgroups, refined around its best), with the same rules. Then local moves
//   (exchange, add or drop a subgroup; swap or move one in the order) improve the best while they
//   help. Windows give GPU totals at the granularity of one subgroup and orders only move the
//   pipeline's fill and drain, so the loss is about one subgroup's copy time at most; measured
//   against every set on 14 distinct sizes it averages well under 1% (tests/planner).
// - The fixed interleavings (one GPU subgroup every K, planner/interleave.h) are candidates
//   too, so a plan is never predicted slower than any of them, nor than all-CPU.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "planner/plan.h"
#include "planner/rates.h"

namespace tide::planner {

struct PlannerOptions {
  std::size_t max_buffers = 0;  // a cap on D; 0: as many as fit (and help)
  // The exact search runs when there are at most this many GPU size multisets...
  std::size_t exact_set_limit = 1 << 14;
  // ...and at most this many (multiset, order) pairs over all of them, each about a microsecond
  // with 50 subgroups. tide's evenly split subgroups (one size and a remainder: about a thousand
  // pairs) plan in about a millisecond.
  std::size_t exact_order_limit = 20000;
};

// The best plan under the model. Throws std::invalid_argument for a bad workload or rates.
Plan plan(const Workload& workload, const Rates& rates, const PlannerOptions& options = {});

// For a given GPU order: the fastest buffer count that fits (ties: the fewest), or nullopt when
// not even one buffer fits. An empty order gives the all-CPU plan.
std::optional<Plan> plan_for_order(const Workload& workload, const Rates& rates,
                                   const std::vector<std::size_t>& gpu_order,
                                   const PlannerOptions& options = {});

}  // namespace tide::planner
