// The scheduler's part of the C ABI (include/tide/tide.h): rates and plans for the Python layer.
#include <limits>
#include <stdexcept>
#include <vector>

#include "capi/status.h"
#include "scheduler/planner.h"
#include "scheduler/rate_sources.h"
#include "scheduler/scheduler_capi.h"
#include "tide/tide.h"

namespace tide::scheduler {

Rates rates_from_c(const tide_rates& r) {
  return Rates{r.cpu_update, r.cpu_update_contended, r.h2d,       r.d2h,
               r.h2d_duplex, r.d2h_duplex,           r.gpu_update};
}

tide_rates rates_to_c(const Rates& r) {
  return tide_rates{r.cpu_update, r.cpu_update_contended, r.h2d,       r.d2h,
                    r.h2d_duplex, r.d2h_duplex,           r.gpu_update};
}

}  // namespace tide::scheduler

namespace {

using tide::capi::require;

using namespace tide::scheduler;

}  // namespace

extern "C" {

TIDE_API tide_status tide_rates_resolve(const char* calibration_path, tide_rates* rates) {
  return tide::capi::guard([&] {
    require(rates != nullptr, "tide_rates_resolve: null output pointer");
    std::optional<std::filesystem::path> path;
    if (calibration_path != nullptr) path = calibration_path;
    *rates = rates_to_c(resolve_rates(path).rates);
  });
}

TIDE_API tide_plan_footprint tide_plan_footprint_default(void) {
  const Footprint f;
  return tide_plan_footprint{f.state_bytes_per_param, f.gradient_bytes_per_param,
                             f.gradients_on_gpu ? 1 : 0};
}

TIDE_API tide_status tide_plan(const uint64_t* subgroup_params, size_t count,
                               uint64_t headroom_bytes, const tide_plan_footprint* footprint,
                               const tide_rates* rates, uint8_t* device, uint32_t* order,
                               tide_plan_summary* summary) {
  return tide::capi::guard([&] {
    require(count == 0 || (subgroup_params != nullptr && device != nullptr && order != nullptr),
            "tide_plan: null array");
    require(summary != nullptr, "tide_plan: null summary pointer");
    require(count <= std::numeric_limits<uint32_t>::max(), "tide_plan: too many subgroups");
    Workload workload;
    workload.subgroup_params.assign(subgroup_params, subgroup_params + count);
    workload.headroom_bytes = headroom_bytes;
    if (footprint != nullptr) {
      workload.footprint.state_bytes_per_param = footprint->state_bytes_per_param;
      workload.footprint.gradient_bytes_per_param = footprint->gradient_bytes_per_param;
      workload.footprint.gradients_on_gpu = footprint->gradients_on_gpu != 0;
    }
    const Rates r = rates != nullptr ? rates_from_c(*rates) : resolve_rates(std::nullopt).rates;
    const Plan p = plan(workload, r);
    for (std::size_t i = 0; i < count; ++i) {
      device[i] = p.subgroups[i].device == Device::gpu ? 1 : 0;
      order[i] = static_cast<uint32_t>(p.subgroups[i].position);
    }
    *summary = tide_plan_summary{
        p.predicted.phase_s, p.predicted.cpu_side_s, p.predicted.gpu_side_s, p.predicted.all_cpu_s,
        p.buffers,           p.buffer_bytes,         p.gpu_bytes(),          p.optimal ? 1 : 0};
  });
}

}  // extern "C"
