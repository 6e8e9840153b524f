#include "planner/performance_model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tide::planner {

PerformanceModel::PerformanceModel(const Rates& rates, const Footprint& footprint)
    : rates_(rates), footprint_(footprint) {
  validate(rates_, "performance model");
  if (footprint_.state_bytes_per_param == 0) {
    throw std::invalid_argument("performance model: state_bytes_per_param must be > 0");
  }
  if (!(footprint_.cpu_update_factor >= 0) || !std::isfinite(footprint_.cpu_update_factor)) {
    throw std::invalid_argument(
        "performance model: cpu_update_factor must be a finite number >= 0 (0: the model's)");
  }
  if (!(footprint_.cpu_update_contended_factor >= 0) ||
      !std::isfinite(footprint_.cpu_update_contended_factor)) {
    throw std::invalid_argument(
        "performance model: cpu_update_contended_factor must be a finite number >= 0 (0: "
        "cpu_update_factor's)");
  }
  rates_.cpu_update *= footprint_.cpu_update_scale();
  rates_.cpu_update_contended *= footprint_.cpu_update_contended_scale();
  rates_.gpu_update *= footprint_.gpu_update_scale();
}

double PerformanceModel::h2d_time(double params, bool duplex) const {
  return params * static_cast<double>(footprint_.h2d_bytes_per_param()) /
         (duplex ? rates_.h2d_duplex : rates_.h2d);
}

double PerformanceModel::h2d_time(double params, bool duplex, double start,
                                  const UploadFlow& flow) const {
  const double link = duplex ? rates_.h2d_duplex : rates_.h2d;
  const double bytes = params * static_cast<double>(footprint_.h2d_bytes_per_param());
  if (start >= flow.end || flow.rate <= 0) return bytes / link;
  const double shared = link - upload_share(flow, link);  // > 0: the share is at most half
  const double before = (flow.end - start) * shared;      // bytes moved until the uploads end
  if (bytes <= before) return bytes / shared;
  return (flow.end - start) + (bytes - before) / link;
}

double PerformanceModel::d2h_time(double params, bool duplex) const {
  return params * static_cast<double>(footprint_.d2h_bytes_per_param()) /
         (duplex ? rates_.d2h_duplex : rates_.d2h);
}

double PerformanceModel::contended_cpu_rate() const {
  return std::min(rates_.cpu_update_contended, rates_.cpu_update);
}

UploadFlow PerformanceModel::upload_flow(double cpu_params) const {
  const double bytes = cpu_params * static_cast<double>(footprint_.upload_bytes_per_param());
  if (!(bytes > 0)) return {};
  UploadFlow flow;
  flow.rate = bytes / cpu_params * contended_cpu_rate();
  flow.end = bytes / upload_share(flow, rates_.h2d_duplex);
  return flow;
}

double PerformanceModel::gpu_side(std::span<const std::uint64_t> sizes, std::size_t buffers,
                                  double cpu_params, std::vector<double>& scratch,
                                  std::vector<GpuTimes>* times) const {
  const std::size_t g = sizes.size();
  if (times != nullptr) times->assign(g, GpuTimes{});
  if (g == 0) return 0;
  if (buffers == 0) throw std::invalid_argument("performance model: GPU subgroups need a buffer");
  const bool duplex = buffers >= 2 && g >= 2;
  // scratch[j] = E_j, the end of subgroup j's copy-out (when its buffer is free again).
  scratch.resize(g);
  const UploadFlow flow = upload_flow(cpu_params);
  double h_end = 0;
  double u_end = 0;
  double e_end = 0;
  for (std::size_t j = 0; j < g; ++j) {
    const double s = static_cast<double>(sizes[j]);
    const double buffer_free = j >= buffers ? scratch[j - buffers] : 0.0;
    const double h_start = std::max(h_end, buffer_free);
    h_end = h_start + h2d_time(s, duplex && j != 0, h_start, flow);
    u_end = std::max(u_end, h_end) + update_time(s);
    e_end = std::max(e_end, u_end) + d2h_time(s, duplex && j + 1 != g);
    scratch[j] = e_end;
    if (times != nullptr) (*times)[j] = GpuTimes{h_start, h_end, u_end, e_end};
  }
  return e_end;
}

double PerformanceModel::gpu_side(std::span<const std::uint64_t> sizes, std::size_t buffers,
                                  double cpu_params) const {
  std::vector<double> scratch;
  return gpu_side(sizes, buffers, cpu_params, scratch);
}

double PerformanceModel::serial_gpu_side(double gpu_params) const {
  return h2d_time(gpu_params, false) + update_time(gpu_params) + d2h_time(gpu_params, false);
}

double PerformanceModel::cpu_side(double cpu_params, double gpu_side) const {
  const double contended = contended_cpu_rate();
  const double during = contended * gpu_side;  // params done while the GPU side runs
  if (cpu_params <= during) return cpu_params / contended;
  return gpu_side + (cpu_params - during) / rates_.cpu_update;
}

double PerformanceModel::link_side(double gpu_params, double cpu_params, bool duplex) const {
  const double bytes = gpu_params * static_cast<double>(footprint_.h2d_bytes_per_param()) +
                       cpu_params * static_cast<double>(footprint_.upload_bytes_per_param());
  return bytes / (duplex ? rates_.h2d_duplex : rates_.h2d);
}

double PerformanceModel::contended_host_memory_rate() const {
  return std::min(rates_.host_memory_contended, rates_.host_memory);
}

double PerformanceModel::host_side(double gpu_params, double cpu_params, double gpu_side) const {
  const double c = footprint_.cpu_host_bytes_per_param();
  const double gpu_bytes = gpu_params * footprint_.gpu_host_bytes_per_param();
  if (!(cpu_params > 0) || !(gpu_params > 0) || !(gpu_side > 0)) {
    return (cpu_params * c + gpu_bytes) / rates_.host_memory;
  }
  const double r_cc = contended_cpu_rate();
  const double b_mc = contended_host_memory_rate();
  const double overlap = std::min(gpu_side, cpu_params / r_cc);
  // The overlap's bytes; the copies' taken at most at B_mc (so that a longer GPU side never
  // shortens the phase: see the header).
  const double bytes =
      c * r_cc * overlap + std::min(gpu_bytes * overlap / gpu_side, b_mc * overlap);
  const double stretched = std::max(overlap, bytes / b_mc);
  const double gpu_end = stretched + (gpu_side - overlap);
  const double tail_rate = std::max(b_mc, std::min(c * rates_.cpu_update, rates_.host_memory));
  const double cpu_end = stretched + c * (cpu_params - r_cc * overlap) / tail_rate;
  return std::max(gpu_end, cpu_end);
}

double PerformanceModel::phase(double cpu_params, double gpu_params, double gpu_side,
                               double link_side) const {
  return std::max({cpu_side(cpu_params, gpu_side), gpu_side, link_side,
                   host_side(gpu_params, cpu_params, gpu_side)});
}

double PerformanceModel::all_cpu(double params) const {
  return std::max(
      {params / rates_.cpu_update, link_side(0, params, false), host_side(0, params, 0)});
}

}  // namespace tide::planner
