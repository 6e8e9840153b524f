#include "planner/plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tide::planner {

const char* device_name(Device device) { return device == Device::gpu ? "gpu" : "cpu"; }

void validate(const Workload& workload) {
  constexpr std::uint64_t kMaxSubgroup = std::uint64_t{1} << 40;
  constexpr std::uint64_t kMaxTotal = std::uint64_t{1} << 53;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < workload.subgroup_params.size(); ++i) {
    const std::uint64_t s = workload.subgroup_params[i];
    if (s == 0 || s > kMaxSubgroup) {
      throw std::invalid_argument("workload: subgroup " + std::to_string(i) + " has " +
                                  std::to_string(s) + " parameters; each needs 1 to 2^40");
    }
    total += s;
    if (total > kMaxTotal) {
      throw std::invalid_argument("workload: more than 2^53 parameters in all");
    }
  }
  const Footprint& f = workload.footprint;
  if (f.state_bytes_per_param < 1 || f.state_bytes_per_param > 64) {
    throw std::invalid_argument("workload: state_bytes_per_param must be from 1 to 64");
  }
  if (f.quantized_moments && f.state_bytes_per_param != 6) {
    throw std::invalid_argument(
        "workload: 8-bit moments' state is 6 bytes per parameter (fp32 weights and two 1-byte "
        "moments) and their scales");
  }
  if (f.gradient_bytes_per_param > 64) {
    throw std::invalid_argument("workload: gradient_bytes_per_param must be from 0 to 64");
  }
}

std::uint64_t Plan::gpu_bytes() const {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  if (buffer_bytes != 0 && buffers > kMax / buffer_bytes) return kMax;
  const std::uint64_t buffer_total = buffers * buffer_bytes;
  std::uint64_t total = buffer_total;
  for (const std::uint64_t b : {resident_bytes, resident_state_bytes}) {
    total = total > kMax - b ? kMax : total + b;
  }
  return total;
}

Plan evaluate(const Workload& workload, const Rates& rates, const Placement& placement) {
  validate(workload);
  const PerformanceModel model(rates, workload.footprint);
  const std::size_t n = workload.subgroup_params.size();

  Plan plan;
  plan.headroom_bytes = workload.headroom_bytes;
  plan.subgroups.resize(n);
  for (std::size_t i = 0; i < n; ++i) plan.subgroups[i].params = workload.subgroup_params[i];

  std::vector<std::uint64_t> gpu_sizes;
  std::uint64_t largest = 0;
  for (std::size_t j = 0; j < placement.gpu_order.size(); ++j) {
    const std::size_t i = placement.gpu_order[j];
    if (i >= n) {
      throw std::invalid_argument("placement: GPU subgroup " + std::to_string(i) +
                                  " does not exist (" + std::to_string(n) + " subgroups)");
    }
    SubgroupPlan& sub = plan.subgroups[i];
    if (sub.device == Device::gpu) {
      throw std::invalid_argument("placement: subgroup " + std::to_string(i) + " is listed twice");
    }
    sub.device = Device::gpu;
    sub.position = j;
    gpu_sizes.push_back(sub.params);
    largest = std::max(largest, sub.params);
    plan.gpu_params += sub.params;
    plan.resident_bytes += workload.footprint.resident_bytes(sub.params);
  }
  plan.gpu_order = placement.gpu_order;
  if (!gpu_sizes.empty()) {
    if (placement.buffers == 0) {
      throw std::invalid_argument("placement: GPU subgroups need at least one buffer");
    }
    plan.buffers = std::min(placement.buffers, gpu_sizes.size());
    plan.buffer_bytes = workload.footprint.buffer_bytes(largest);
  }

  std::uint64_t cpu_params = 0;
  for (const SubgroupPlan& sub : plan.subgroups) {
    if (sub.device == Device::cpu) cpu_params += sub.params;
  }
  std::vector<double> scratch;
  std::vector<GpuTimes> times;
  const double gpu_side =
      model.gpu_side(gpu_sizes, plan.buffers, static_cast<double>(cpu_params), scratch, &times);
  for (std::size_t j = 0; j < plan.gpu_order.size(); ++j) {
    SubgroupPlan& sub = plan.subgroups[plan.gpu_order[j]];
    sub.buffer = j % plan.buffers;
    sub.start_s = times[j].h2d_start;
    sub.h2d_end_s = times[j].h2d_end;
    sub.update_end_s = times[j].update_end;
    sub.end_s = times[j].d2h_end;
  }

  double done = 0;
  for (std::size_t i = 0; i < n; ++i) {
    SubgroupPlan& sub = plan.subgroups[i];
    if (sub.device != Device::cpu) continue;
    sub.position = plan.cpu_order.size();
    plan.cpu_order.push_back(i);
    sub.start_s = model.cpu_side(done, gpu_side);
    done += static_cast<double>(sub.params);
    sub.end_s = model.cpu_side(done, gpu_side);
  }
  plan.cpu_params = cpu_params;

  const bool duplex = plan.buffers >= 2 && plan.gpu_order.size() >= 2;
  Prediction& p = plan.predicted;
  p.gpu_side_s = gpu_side;
  p.cpu_side_s = model.cpu_side(static_cast<double>(plan.cpu_params), gpu_side);
  p.link_s = model.link_side(static_cast<double>(plan.gpu_params),
                             static_cast<double>(plan.cpu_params), duplex);
  p.host_s = model.host_side(static_cast<double>(plan.gpu_params),
                             static_cast<double>(plan.cpu_params), gpu_side);
  p.phase_s = std::max({p.cpu_side_s, gpu_side, p.link_s, p.host_s});
  p.all_cpu_s = model.all_cpu(static_cast<double>(plan.cpu_params + plan.gpu_params));
  return plan;
}

Plan all_cpu_plan(const Workload& workload, const Rates& rates) {
  return evaluate(workload, rates, Placement{});
}

}  // namespace tide::planner
