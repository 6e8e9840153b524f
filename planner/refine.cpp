#include "planner/refine.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "planner/performance_model.h"

namespace tide::planner {

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
  // The update rates are kept for fp32 state (the model scales them to the footprint's): an
  // update of `params` parameters in this format counts as params / scale of fp32 state.
  const double cpu_fp32_equivalent = 1.0 / footprint.cpu_update_scale();
  const double gpu_fp32_equivalent = 1.0 / footprint.gpu_update_scale();
  // The CPU subgroups' weight uploads share the host→GPU link with the copy-ins (the model's
  // flow, planner/performance_model.h): a copy-in that ran while they did moved its own bytes
  // and the flow's share of the link, which is what its link's rate is measured on.
  const UploadFlow flow =
      PerformanceModel(rates_, footprint).upload_flow(static_cast<double>(plan.cpu_params));
  for (std::size_t i = 0; i < timings.size(); ++i) {
    const SubgroupPlan& sub = plan.subgroups[i];
    const SubgroupTiming& t = timings[i];
    const double params = static_cast<double>(sub.params);
    if (sub.device == Device::cpu) {
      // The contended rate when the plan runs it while the GPU side runs, the free rate when it
      // runs after; one that straddles the end of the GPU side measures neither.
      const double gpu_end = plan.predicted.gpu_side_s;
      if (g > 0 && sub.end_s <= gpu_end) {
        used +=
            observe(RateKind::cpu_update_contended, params * cpu_fp32_equivalent, t.cpu_update_s);
      } else if (g == 0 || sub.start_s >= gpu_end) {
        used += observe(RateKind::cpu_update, params * cpu_fp32_equivalent, t.cpu_update_s);
      }
      continue;
    }
    const bool first = sub.position == 0;
    const bool last = sub.position + 1 == g;
    const RateKind h2d_kind = duplex && !first ? RateKind::h2d_duplex : RateKind::h2d;
    double shared = 0;  // seconds of the copy-in that shared the link with the uploads
    if (flow.rate > 0 && sub.h2d_end_s > sub.start_s && t.h2d_s > 0) {
      const double overlap = std::clamp(std::min(sub.h2d_end_s, flow.end) - sub.start_s, 0.0,
                                        sub.h2d_end_s - sub.start_s);
      shared = t.h2d_s * overlap / (sub.h2d_end_s - sub.start_s);
    }
    const double link = rate_of(rates_, h2d_kind);
    used +=
        observe(h2d_kind, params * h2d_bytes + PerformanceModel::upload_share(flow, link) * shared,
                t.h2d_s);
    used += observe(RateKind::gpu_update, params * gpu_fp32_equivalent, t.gpu_update_s);
    used += observe(duplex && !last ? RateKind::d2h_duplex : RateKind::d2h, params * d2h_bytes,
                    t.d2h_s);
  }
  return used;
}

}  // namespace tide::planner
