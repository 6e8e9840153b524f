#include "planner/interleave.h"

#include <cmath>
#include <stdexcept>

namespace tide::planner {

std::vector<std::size_t> interleaved_gpu_subgroups(std::size_t n, std::size_t k) {
  if (k == 0) throw std::invalid_argument("interleaving: K must be >= 1");
  std::vector<std::size_t> gpu;
  for (std::size_t i = 0; i < n; i += k) gpu.push_back(i);
  return gpu;
}

std::optional<Plan> plan_interleaved(const Workload& workload, const Rates& rates, std::size_t k,
                                     const PlannerOptions& options) {
  return plan_for_order(workload, rates,
                        interleaved_gpu_subgroups(workload.subgroup_params.size(), k), options);
}

std::size_t published_k(const Rates& rates, const Footprint& footprint, std::uint64_t params) {
  const PerformanceModel model(rates, footprint);
  const double s = static_cast<double>(params);
  const double round_trip =
      model.h2d_time(s, false) + model.update_time(s) + model.d2h_time(s, false);
  const double cpu = s / model.rates().cpu_update;
  // (K − 1)·cpu ≥ round_trip
  return 1 + static_cast<std::size_t>(std::ceil(round_trip / cpu));
}

}  // namespace tide::planner
