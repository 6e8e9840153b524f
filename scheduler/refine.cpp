#include "scheduler/refine.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tide::scheduler {

RateRefiner::RateRefiner(const Rates& initial, const RefineOptions& options)
    : rates_(initial), options_(options) {
  validate(rates_, "rate refinement");
  if (!(options_.weight > 0 && options_.weight <= 1)) {
    throw std::invalid_argument("rate refinement: weight must be in (0, 1]");
  }
  if (!(options_.max_step > 1) || !std::isfinite(options_.max_step)) {
    throw std::invalid_argument("rate refinement: max_step must be a finite number > 1");
  }
}

bool RateRefiner::observe(RateKind kind, double amount, double seconds) {
  if (!(amount > 0) || !(seconds > 0) || !std::isfinite(amount) || !std::isfinite(seconds)) {
    return false;
  }
  const double observed = amount / seconds;
  if (!std::isfinite(observed) || observed <= 0) return false;
  double& rate = rate_of(rates_, kind);
  std::uint64_t& n = counts_[static_cast<std::size_t>(kind)];
  ++n;
  const double weight = std::max(options_.weight, 1.0 / static_cast<double>(n));
  const double limit = std::log(options_.max_step);
  const double step = std::clamp(std::log(observed / rate), -limit, limit);
  rate *= std::exp(weight * step);
  return true;
}

std::size_t RateRefiner::observe_phase(const Plan& plan, const Footprint& footprint,
                                       std::span<const SubgroupTiming> timings) {
  if (timings.size() != plan.subgroups.size()) {
    throw std::invalid_argument("rate refinement: " + std::to_string(timings.size()) +
                                " timings for a plan of " + std::to_string(plan.subgroups.size()) +
                                " subgroups");
  }
  std::size_t used = 0;
  const std::size_t g = plan.gpu_order.size();
  const bool duplex = plan.buffers >= 2 && g >= 2;
  const double h2d_bytes = static_cast<double>(footprint.h2d_bytes_per_param());
  const double d2h_bytes = static_cast<double>(footprint.d2h_bytes_per_param());
  for (std::size_t i = 0; i < timings.size(); ++i) {
    const SubgroupPlan& sub = plan.subgroups[i];
    const SubgroupTiming& t = timings[i];
    const double params = static_cast<double>(sub.params);
    if (sub.device == Device::cpu) {
      // The contended rate when the plan runs it while the GPU side runs, the free rate when it
      // runs after; one that straddles the end of the GPU side measures neither.
      const double gpu_end = plan.predicted.gpu_side_s;
      if (g > 0 && sub.end_s <= gpu_end) {
        used += observe(RateKind::cpu_update_contended, params, t.cpu_update_s);
      } else if (g == 0 || sub.start_s >= gpu_end) {
        used += observe(RateKind::cpu_update, params, t.cpu_update_s);
      }
      continue;
    }
    const bool first = sub.position == 0;
    const bool last = sub.position + 1 == g;
    used += observe(duplex && !first ? RateKind::h2d_duplex : RateKind::h2d, params * h2d_bytes,
                    t.h2d_s);
    used += observe(RateKind::gpu_update, params, t.gpu_update_s);
    used += observe(duplex && !last ? RateKind::d2h_duplex : RateKind::d2h, params * d2h_bytes,
                    t.d2h_s);
  }
  return used;
}

}  // namespace tide::scheduler
