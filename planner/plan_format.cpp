#include "planner/plan_format.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "io/json_writer.h"
#include "planner/units.h"

namespace tide::planner {
namespace {

namespace json = io::json;

std::string printf_string(const char* format, auto... args) {
  char buffer[256];
  std::snprintf(buffer, sizeof buffer, format, args...);
  return buffer;
}

template <typename T>
std::string json_list(const std::vector<T>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    out += (i ? "," : "") + std::to_string(values[i]);
  }
  return out + "]";
}

}  // namespace

std::string plan_table(const Plan& plan) {
  std::ostringstream out;
  out << "subgroup      params  device  order  buffer   start s     end s\n";
  for (std::size_t i = 0; i < plan.subgroups.size(); ++i) {
    const SubgroupPlan& s = plan.subgroups[i];
    const std::string buffer = s.buffer == kNoBuffer ? "-" : std::to_string(s.buffer);
    out << printf_string("%8zu  %10s  %-6s  %5zu  %6s  %8.3f  %8.3f\n", i,
                         format_sci(static_cast<double>(s.params)).c_str(),
                         s.device == Device::cpu ? "CPU" : (s.resident ? "GPU*" : "GPU"),
                         s.position, buffer.c_str(), s.start_s, s.end_s);
  }
  const auto resident =
      static_cast<std::size_t>(std::count_if(plan.subgroups.begin(), plan.subgroups.end(),
                                             [](const SubgroupPlan& s) { return s.resident; }));
  if (resident != 0) {
    out << "(GPU*: resident, its state kept in device memory and updated in place)\n";
  }
  const double total = static_cast<double>(plan.gpu_params + plan.cpu_params);
  out << "\n"
      << printf_string("GPU subgroups    %zu of %zu, %s params (%.1f%% of the parameters)\n",
                       plan.gpu_subgroups(), plan.subgroups.size(),
                       format_sci(static_cast<double>(plan.gpu_params)).c_str(),
                       total > 0 ? 100.0 * static_cast<double>(plan.gpu_params) / total : 0.0);
  const std::string state =
      resident != 0 ? " + " + format_gb(static_cast<double>(plan.resident_state_bytes)) +
                          " of resident state (" + std::to_string(resident) + " subgroup" +
                          (resident == 1 ? "" : "s") + ")"
                    : "";
  out << printf_string(
      "GPU memory       %zu buffer%s of %s + %s of kept gradients%s = %s of %s "
      "headroom\n",
      plan.buffers, plan.buffers == 1 ? "" : "s",
      format_gb(static_cast<double>(plan.buffer_bytes)).c_str(),
      format_gb(static_cast<double>(plan.resident_bytes)).c_str(), state.c_str(),
      format_gb(static_cast<double>(plan.gpu_bytes())).c_str(),
      format_gb(static_cast<double>(plan.headroom_bytes)).c_str());
  const Prediction& p = plan.predicted;
  out << printf_string(
      "update phase     %.3f s predicted (CPU side %.3f s, GPU side %.3f s, host-to-GPU link "
      "%.3f s, host memory %.3f s)%s\n",
      p.phase_s, p.cpu_side_s, p.gpu_side_s, p.link_s, p.host_s,
      plan.optimal ? ", optimal under the model" : "");
  out << printf_string("all-CPU          %.3f s predicted; speed-up %.2fx\n", p.all_cpu_s,
                       p.speedup());
  return out.str();
}

std::string plan_json(const Plan& plan) {
  std::ostringstream out;
  const Prediction& p = plan.predicted;
  out << "{\"optimal\":" << (plan.optimal ? "true" : "false") << ",\"buffers\":" << plan.buffers
      << ",\"buffer_bytes\":" << plan.buffer_bytes << ",\"resident_bytes\":" << plan.resident_bytes
      << ",\"resident_state_bytes\":" << plan.resident_state_bytes
      << ",\"gpu_bytes\":" << plan.gpu_bytes() << ",\"headroom_bytes\":" << plan.headroom_bytes
      << ",\"gpu_subgroups\":" << plan.gpu_subgroups() << ",\"gpu_params\":" << plan.gpu_params
      << ",\"cpu_params\":" << plan.cpu_params
      << ",\"predicted\":{\"phase_s\":" << json::number(p.phase_s)
      << ",\"cpu_side_s\":" << json::number(p.cpu_side_s)
      << ",\"gpu_side_s\":" << json::number(p.gpu_side_s)
      << ",\"link_s\":" << json::number(p.link_s) << ",\"host_s\":" << json::number(p.host_s)
      << ",\"all_cpu_s\":" << json::number(p.all_cpu_s)
      << ",\"speedup\":" << json::number(p.speedup())
      << "},\"gpu_order\":" << json_list(plan.gpu_order)
      << ",\"cpu_order\":" << json_list(plan.cpu_order) << ",\"subgroups\":[";
  for (std::size_t i = 0; i < plan.subgroups.size(); ++i) {
    const SubgroupPlan& s = plan.subgroups[i];
    out << (i ? "," : "") << "{\"index\":" << i << ",\"params\":" << s.params
        << ",\"device\":" << json::quote(device_name(s.device)) << ",\"order\":" << s.position;
    if (s.device == Device::gpu) {
      out << ",\"buffer\":" << s.buffer << ",\"resident\":" << (s.resident ? "true" : "false");
    }
    out << ",\"start_s\":" << json::number(s.start_s);
    if (s.device == Device::gpu) {
      out << ",\"h2d_end_s\":" << json::number(s.h2d_end_s)
          << ",\"update_end_s\":" << json::number(s.update_end_s);
    }
    out << ",\"end_s\":" << json::number(s.end_s) << "}";
  }
  out << "]}";
  return out.str();
}

}  // namespace tide::planner
