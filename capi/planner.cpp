// The planner's part of the C ABI (include/tide/tide.h): rates and plans for the Python layer.
#include <cstddef>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "capi/planner.h"
#include "capi/status.h"
#include "capi/versioned.h"
#include "planner/planner.h"
#include "planner/rate_sources.h"
#include "tide/tide.h"

namespace tide::capi {

using planner::Rates;

Rates rates_from_c(const tide_rates& r) {
  // tide_rates (a plain record) has no host memory rates: the built-in ones stand in (Rates');
  // tide_optimizer_options gives them beside it.
  return Rates{r.cpu_update, r.cpu_update_contended, r.h2d,       r.d2h,
               r.h2d_duplex, r.d2h_duplex,           r.gpu_update};
}

tide_plan_summary summary_to_c(const planner::Plan& p) {
  return tide_plan_summary{sizeof(tide_plan_summary),
                           p.predicted.phase_s,
                           p.predicted.cpu_side_s,
                           p.predicted.gpu_side_s,
                           p.predicted.all_cpu_s,
                           p.buffers,
                           p.buffer_bytes,
                           p.gpu_bytes(),
                           p.optimal ? 1 : 0};
}

tide_rates rates_to_c(const Rates& r) {
  return tide_rates{r.cpu_update, r.cpu_update_contended, r.h2d,       r.d2h,
                    r.h2d_duplex, r.d2h_duplex,           r.gpu_update};
}

tide_host_memory_rates host_memory_rates_to_c(const Rates& r) {
  return tide_host_memory_rates{sizeof(tide_host_memory_rates), r.host_memory,
                                r.host_memory_contended};
}

}  // namespace tide::capi

namespace {

using tide::capi::host_memory_rates_to_c;
using tide::capi::rates_from_c;
using tide::capi::rates_to_c;
using tide::capi::require;
using tide::capi::summary_to_c;

using namespace tide::planner;

tide_plan_footprint default_footprint() {
  const Footprint f;
  tide_plan_footprint out{};
  out.struct_size = sizeof(tide_plan_footprint);
  out.state_bytes_per_param = f.state_bytes_per_param;
  out.gradient_bytes_per_param = f.gradient_bytes_per_param;
  out.gradients_on_gpu = f.gradients_on_gpu ? 1 : 0;
  out.weight_bytes_per_param = f.weight_bytes_per_param;
  return out;
}

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

TIDE_API tide_status tide_host_memory_rates_resolve(const char* calibration_path,
                                                    tide_host_memory_rates* rates) {
  return tide::capi::guard([&] {
    require(rates != nullptr, "tide_host_memory_rates_resolve: null output pointer");
    std::optional<std::filesystem::path> path;
    if (calibration_path != nullptr) path = calibration_path;
    tide::capi::write_versioned(rates, host_memory_rates_to_c(resolve_rates(path).rates),
                                "tide_host_memory_rates");
  });
}

TIDE_API tide_status tide_plan_footprint_init(tide_plan_footprint* footprint) {
  return tide::capi::guard([&] {
    require(footprint != nullptr, "tide_plan_footprint_init: null footprint");
    tide::capi::write_versioned(footprint, default_footprint(), "tide_plan_footprint");
  });
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
    const tide_plan_footprint given =
        footprint == nullptr
            ? default_footprint()
            : tide::capi::read_versioned(*footprint, default_footprint(), "tide_plan_footprint");
    tide::capi::check_struct_size<tide_plan_summary>(summary->struct_size, "tide_plan_summary");
    require(given.quantized_moments == 0 || given.quantized_moments == 1,
            "tide_plan: quantized_moments must be 0 or 1");
    require(given.bf16_master == 0 || given.bf16_master == 1,
            "tide_plan: bf16_master must be 0 or 1");
    require(!(given.quantized_moments && given.bf16_master),
            "tide_plan: bf16 master weights with 8-bit moments are not supported");
    require(given.cpu_update_factor == 0 || plausible_cpu_update_factor(given.cpu_update_factor),
            "tide_plan: cpu_update_factor must be 0 (not measured) or from 0.01 to 100");
    require(given.cpu_update_contended_factor == 0 ||
                plausible_cpu_update_factor(given.cpu_update_contended_factor),
            "tide_plan: cpu_update_contended_factor must be 0 (not measured) or from 0.01 to "
            "100");
    Workload workload;
    workload.subgroup_params.assign(subgroup_params, subgroup_params + count);
    workload.headroom_bytes = headroom_bytes;
    Footprint& f = workload.footprint;
    f.state_bytes_per_param = given.state_bytes_per_param;
    f.gradient_bytes_per_param = given.gradient_bytes_per_param;
    f.gradients_on_gpu = given.gradients_on_gpu != 0;
    f.quantized_moments = given.quantized_moments != 0;
    f.weight_bytes_per_param = given.weight_bytes_per_param;
    if (given.bf16_master != 0) {
      f.weights_in_state = true;
      f.state_bytes_on_gpu = 2;  // the bf16 weights, from the model's parameters
    }
    f.stage_low_precision_weights();
    Rates r;
    if (rates != nullptr) {
      r = rates_from_c(*rates);
    } else {
      const ResolvedRates resolved = resolve_rates(std::nullopt);
      r = resolved.rates;
      f.calibrate_cpu(resolved.cpu_update_factors());
    }
    // A given factor replaces the file's for both rates, unless the contended one is given too.
    if (given.cpu_update_factor > 0) {
      f.cpu_update_factor = given.cpu_update_factor;
      f.cpu_update_contended_factor = given.cpu_update_factor;
    }
    if (given.cpu_update_contended_factor > 0) {
      f.cpu_update_contended_factor = given.cpu_update_contended_factor;
    }
    const Plan p = plan(workload, r);
    for (std::size_t i = 0; i < count; ++i) {
      device[i] = p.subgroups[i].device == Device::gpu ? 1 : 0;
      order[i] = static_cast<uint32_t>(p.subgroups[i].position);
    }
    tide::capi::write_versioned(summary, summary_to_c(p), "tide_plan_summary");
  });
}

}  // extern "C"
