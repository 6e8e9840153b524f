// The published interleaving: one GPU subgroup every K subgroups (subgroups 0, K, 2K, ... on the
// GPU, the rest on the CPU), and the published rule for choosing K. The planner considers every
// K among its candidates; these functions let tests and benchmarks compare against fixed K.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "planner/performance_model.h"
#include "planner/plan.h"
#include "planner/planner.h"

namespace tide::planner {

// Subgroups i of n with i % k == 0, ascending (k ≥ 1; k = 1 is all-GPU).
std::vector<std::size_t> interleaved_gpu_subgroups(std::size_t n, std::size_t k);

// The fixed-K plan with the fastest buffer count that fits; nullopt when not even one buffer
// fits.
std::optional<Plan> plan_interleaved(const Workload& workload, const Rates& rates, std::size_t k,
                                     const PlannerOptions& options = {});

// The published rule for subgroups of `params`: the smallest K with
// (K − 1)·T_cpu ≥ T_h2d + T_gpu + T_d2h (copies alone, no pipelining), i.e. the CPU updates K − 1
// subgroups while one makes its round trip to the GPU. It ignores memory; bound it by what fits.
std::size_t published_k(const Rates& rates, const Footprint& footprint, std::uint64_t params);

}  // namespace tide::planner
