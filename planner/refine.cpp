#include "planner/refine.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

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
  const auto k = static_cast<std::size_t>(kind);
  std::uint64_t& n = counts_[k];
  ++n;
  phase_[k].log_sum += std::log(observed);
  ++phase_[k].count;
  const double weight = std::max(options_.weight, 1.0 / static_cast<double>(n));
  const double limit = std::log(options_.max_step);
  const double step = std::clamp(std::log(observed / rate), -limit, limit);
  rate *= std::exp(weight * step);
  return true;
}

namespace {

bool measured(double seconds) { return seconds > 0 && std::isfinite(seconds); }

// When the plan has both sides running: until the shorter one ends.
double overlap_end(const Plan& plan) {
  return std::min(plan.predicted.gpu_side_s, plan.predicted.cpu_side_s);
}

// The GPU subgroups whose state is copied in and out (not resident), in the pipeline's order:
// each one's place among them, and how many there are.
struct CopiedOrder {
  std::vector<std::size_t> position;  // by subgroup index
  std::size_t count = 0;
};
CopiedOrder copied_order(const Plan& plan) {
  CopiedOrder order;
  order.position.assign(plan.subgroups.size(), 0);
  for (std::size_t s : plan.gpu_order) {
    if (!plan.subgroups.at(s).resident) order.position[s] = order.count++;
  }
  return order;
}

}  // namespace

RateRefiner::HostTraffic RateRefiner::traffic_of(const Plan& plan, const Footprint& footprint,
                                                 std::span<const SubgroupTiming> timings) const {
  HostTraffic traffic;
  const PerformanceModel model(rates_, footprint);
  const CopiedOrder order = copied_order(plan);
  const std::size_t g = order.count;
  const bool duplex = plan.buffers >= 2 && g >= 2;
  const bool any_gpu = !plan.gpu_order.empty();
  for (std::size_t i = 0; i < timings.size(); ++i) {
    const SubgroupPlan& sub = plan.subgroups[i];
    const SubgroupTiming& t = timings[i];
    const double params = static_cast<double>(sub.params);
    if (sub.resident) continue;  // its copies, if any, are not the pipeline's
    if (sub.device == Device::cpu) {
      if (!measured(t.cpu_update_s)) continue;
      if (any_gpu && sub.end_s <= plan.predicted.gpu_side_s) {
        traffic.contended_params += params;
        traffic.contended_s += t.cpu_update_s;
        ++traffic.contended_subgroups;
      } else if (!any_gpu || sub.start_s >= plan.predicted.gpu_side_s) {
        traffic.free_params += params;
        traffic.free_s += t.cpu_update_s;
      }
    } else if (sub.end_s <= overlap_end(plan) && measured(t.h2d_s) && measured(t.d2h_s)) {
      traffic.h2d_bytes += params * footprint.h2d_bytes_per_param();
      traffic.h2d_s += t.h2d_s;
      traffic.d2h_bytes += params * footprint.d2h_bytes_per_param();
      traffic.d2h_s += t.d2h_s;
      // What the plan had them take, at the rates it was made with.
      traffic.h2d_planned_s += sub.h2d_end_s - sub.start_s;
      traffic.d2h_planned_s += model.d2h_time(params, duplex && order.position[i] + 1 != g);
    }
  }
  if (!duplex || traffic.contended_s <= 0 || traffic.h2d_s <= 0 || traffic.d2h_s <= 0) {
    return traffic;
  }
  const double cpu_bytes = footprint.cpu_host_bytes_per_param();
  const double cpu_rate = traffic.contended_params / traffic.contended_s;
  // The copies' bytes over the overlap as it ran: the plan's, stretched as its copies were.
  const double copy_bytes = traffic.h2d_bytes + traffic.d2h_bytes;
  const double planned = overlap_end(plan);
  if (!(planned > 0) || traffic.h2d_planned_s <= 0 || traffic.d2h_planned_s <= 0) {
    return traffic;
  }
  const double h2d_ratio = traffic.h2d_s / traffic.h2d_planned_s;
  const double d2h_ratio = traffic.d2h_s / traffic.d2h_planned_s;
  const double overlap = planned * std::max({1.0, h2d_ratio, d2h_ratio});
  traffic.moved = cpu_bytes * cpu_rate + copy_bytes / overlap;
  // Both sides well below their rates in the plan at once: host memory held them back.
  const double cpu_planned = model.contended_cpu_rate();
  traffic.saturated = cpu_rate < kSaturatedFraction * cpu_planned &&
                      h2d_ratio * kSaturatedFraction > 1 && d2h_ratio * kSaturatedFraction > 1;
  if (traffic.saturated) {
    // Host memory slowed both by the same ratio (the model's assumption): the smallest of their
    // slowdowns against the plan is host memory's, and the rest of one side's is its own rate's.
    traffic.slowdown = std::min({cpu_planned / cpu_rate, h2d_ratio, d2h_ratio});
  }
  return traffic;
}

std::size_t RateRefiner::observe_phase(const Plan& plan, const Footprint& footprint,
                                       std::span<const SubgroupTiming> timings) {
  if (timings.size() != plan.subgroups.size()) {
    throw std::invalid_argument("rate refinement: " + std::to_string(timings.size()) +
                                " timings for a plan of " + std::to_string(plan.subgroups.size()) +
                                " subgroups");
  }
  const Rates before = rates_;
  phase_ = {};
  const std::size_t used = observe_subgroups(plan, footprint, timings);
  const double limit = std::pow(options_.max_step, options_.weight);
  for (const RateInfo& info : rate_infos()) {
    const auto k = static_cast<std::size_t>(info.kind);
    if (phase_[k].count == 0) continue;
    if (const std::uint64_t phase = phases_[k]++; phase < kFreePhases) {
      agree(k, phase);
      continue;
    }
    const double was = before.*info.member;
    rates_.*info.member = std::clamp(rates_.*info.member, was / limit, was * limit);
  }
  return used;
}

void RateRefiner::agree(std::size_t k, std::uint64_t phase) {
  std::array<double, kAgreeingPhases>& recent = recent_[k];
  recent[phase % kAgreeingPhases] =
      std::exp(phase_[k].log_sum / static_cast<double>(phase_[k].count));
  if (phase + 1 < kAgreeingPhases) return;
  const auto [low, high] = std::minmax_element(recent.begin(), recent.end());
  double& rate = rate_of(rates_, static_cast<RateKind>(k));
  if (*low > rate * options_.max_step) rate = *low;
  if (*high < rate / options_.max_step) rate = *high;
}

std::size_t RateRefiner::observe_subgroups(const Plan& plan, const Footprint& footprint,
                                           std::span<const SubgroupTiming> timings) {
  std::size_t used = 0;
  const CopiedOrder order = copied_order(plan);
  const std::size_t g = order.count;
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
  // When host memory was full, the CPU update and the copies ran slower than their own rates by
  // the ratio of what they asked to what it gave: their times count divided by it (the model
  // charges the slowdown to host memory, performance_model.h).
  const HostTraffic traffic = traffic_of(plan, footprint, timings);
  const double own = 1.0 / traffic.slowdown;
  for (std::size_t i = 0; i < timings.size(); ++i) {
    const SubgroupPlan& sub = plan.subgroups[i];
    const SubgroupTiming& t = timings[i];
    const double params = static_cast<double>(sub.params);
    if (sub.device == Device::cpu) {
      // The contended rate when the plan runs it while the GPU side runs, the free rate when it
      // runs after; one that straddles the end of the GPU side measures neither.
      const double gpu_end = plan.predicted.gpu_side_s;
      const bool any_gpu = !plan.gpu_order.empty();
      if (any_gpu && sub.end_s <= gpu_end) {
        used += observe(RateKind::cpu_update_contended, params * cpu_fp32_equivalent,
                        t.cpu_update_s * own);
      } else if (!any_gpu || sub.start_s >= gpu_end) {
        used += observe(RateKind::cpu_update, params * cpu_fp32_equivalent, t.cpu_update_s);
      }
      continue;
    }
    used += observe(RateKind::gpu_update, params * gpu_fp32_equivalent, t.gpu_update_s);
    // A resident update is timed by its kernel alone: its copies in, if any, ran before the
    // pipeline's.
    if (sub.resident) continue;
    const bool first = order.position[i] == 0;
    const bool last = order.position[i] + 1 == g;
    const RateKind h2d_kind = duplex && !first ? RateKind::h2d_duplex : RateKind::h2d;
    // The copy's own time: without host memory's slowdown (1 unless it was full).
    const double copy_own = sub.end_s <= overlap_end(plan) ? own : 1.0;
    double shared = 0;  // seconds of the copy-in that shared the link with the uploads
    if (flow.rate > 0 && sub.h2d_end_s > sub.start_s && t.h2d_s > 0) {
      const double overlap = std::clamp(std::min(sub.h2d_end_s, flow.end) - sub.start_s, 0.0,
                                        sub.h2d_end_s - sub.start_s);
      shared = t.h2d_s * copy_own * overlap / (sub.h2d_end_s - sub.start_s);
    }
    const double link = rate_of(rates_, h2d_kind);
    used +=
        observe(h2d_kind, params * h2d_bytes + PerformanceModel::upload_share(flow, link) * shared,
                t.h2d_s * copy_own);
    used += observe(duplex && !last ? RateKind::d2h_duplex : RateKind::d2h, params * d2h_bytes,
                    t.d2h_s * copy_own);
  }
  // The CPU update cannot run faster beside copies than alone: what it did beside them in this
  // phase is a lower bound of its free rate (which only phases whose CPU side outlasts the GPU
  // side measure), so that a free rate left below it (one slow phase) cannot stay there for
  // good. The phase's mean, once per subgroup that measured it: as fast as the contended rate
  // learns, and never past the mean.
  if (traffic.contended_s > 0) {
    const double params = traffic.contended_params * cpu_fp32_equivalent;
    const double seconds = traffic.contended_s * own;
    for (std::size_t k = 0; k < traffic.contended_subgroups && params / seconds > rates_.cpu_update;
         ++k) {
      used += observe(RateKind::cpu_update, params, seconds);
    }
  }
  return used + observe_host_memory(traffic, footprint);
}

std::size_t RateRefiner::observe_host_memory(const HostTraffic& traffic,
                                             const Footprint& footprint) {
  std::size_t used = 0;
  const double cpu_bytes = footprint.cpu_host_bytes_per_param();
  // Alone: the CPU side moved at least this much, so host memory can.
  if (traffic.free_s > 0) {
    const double moved = cpu_bytes * traffic.free_params / traffic.free_s;
    if (moved > rates_.host_memory) used += observe(RateKind::host_memory, moved, 1.0);
  }
  // While copies ran in both directions (traffic_of): the CPU side's bytes per second and the
  // copies' (each direction over its busy time; in the pipeline's steady state they run all
  // along). Full, what moved is host memory's rate; otherwise it gave at least that much.
  if (traffic.saturated || traffic.moved > rates_.host_memory_contended) {
    used += observe(RateKind::host_memory_contended, traffic.moved, 1.0);
  }
  return used;
}

}  // namespace tide::planner
