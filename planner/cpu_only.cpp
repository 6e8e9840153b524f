#include "planner/cpu_only.h"

#include <algorithm>
#include <optional>
#include <stdexcept>

namespace tide::planner {
namespace {

void check(const Workload& workload, const std::vector<char>& gpu_allowed) {
  if (!gpu_allowed.empty() && gpu_allowed.size() != workload.subgroup_params.size()) {
    throw std::invalid_argument("tide: planner: one GPU-allowed flag per subgroup");
  }
}

Plan for_order(const Workload& workload, const Rates& rates, const std::vector<std::size_t>& order,
               const PlannerOptions& options) {
  std::optional<Plan> out = plan_for_order(workload, rates, order, options);
  return out ? *out : all_cpu_plan(workload, rates);
}

}  // namespace

bool all_gpu_allowed(const std::vector<char>& gpu_allowed) {
  return std::all_of(gpu_allowed.begin(), gpu_allowed.end(), [](char c) { return c != 0; });
}

Plan plan_allowed(const Workload& workload, const Rates& rates,
                  const std::vector<char>& gpu_allowed, const PlannerOptions& options) {
  check(workload, gpu_allowed);
  if (all_gpu_allowed(gpu_allowed)) return plan(workload, rates, options);
  Workload sub = workload;
  sub.subgroup_params.clear();
  std::vector<std::size_t> index;  // sub's subgroup j is workload's index[j]
  for (std::size_t s = 0; s < gpu_allowed.size(); ++s) {
    if (gpu_allowed[s] == 0) continue;
    index.push_back(s);
    sub.subgroup_params.push_back(workload.subgroup_params[s]);
  }
  Plan best = all_cpu_plan(workload, rates);
  if (index.empty()) return best;
  std::vector<std::size_t> order;
  for (std::size_t j : plan(sub, rates, options).gpu_order) order.push_back(index[j]);
  for (const auto& candidate : {order, index}) {
    const Plan p = for_order(workload, rates, candidate, options);
    if (p.predicted.phase_s < best.predicted.phase_s) best = p;
  }
  return best;
}

Plan without_disallowed(const Plan& chosen, const Workload& workload, const Rates& rates,
                        const std::vector<char>& gpu_allowed, const PlannerOptions& options) {
  check(workload, gpu_allowed);
  if (all_gpu_allowed(gpu_allowed)) return chosen;
  std::vector<std::size_t> order;
  for (std::size_t s : chosen.gpu_order) {
    if (gpu_allowed[s] != 0) order.push_back(s);
  }
  if (order.size() == chosen.gpu_order.size()) return chosen;
  return for_order(workload, rates, order, options);
}

}  // namespace tide::planner
