#include "planner/iteration_model.h"

#include <algorithm>
#include <stdexcept>

namespace tide::planner {

double predict_forward(std::span<const LayerTimes> layers) {
  double t = 0;
  for (const LayerTimes& l : layers) t += l.forward_s;
  return t;
}

double predict_backward(std::span<const LayerTimes> layers, double d2h_bytes_per_s, bool blocking) {
  if (!(d2h_bytes_per_s > 0)) throw std::invalid_argument("predict_backward: rate must be > 0");
  double compute = 0, copies = 0;
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
    compute += it->backward_s;
    const double copy = static_cast<double>(it->gradient_bytes) / d2h_bytes_per_s;
    copies = blocking ? copies + copy : std::max(compute, copies) + copy;
  }
  return blocking ? compute + copies : std::max(compute, copies);
}

std::vector<std::uint64_t> host_gradient_bytes(std::span<const std::uint64_t> subgroup_params,
                                               std::size_t layers, unsigned gradient_bytes,
                                               std::span<const std::size_t> kept) {
  std::uint64_t total = 0;
  for (std::uint64_t n : subgroup_params) total += n;
  if (layers == 0 || layers > total) {
    throw std::invalid_argument("host_gradient_bytes: between 1 layer and one per parameter");
  }
  std::vector<char> on_gpu(subgroup_params.size(), 0);
  for (std::size_t s : kept) {
    if (s >= on_gpu.size()) throw std::invalid_argument("host_gradient_bytes: no such subgroup");
    on_gpu[s] = 1;
  }
  const std::uint64_t per_layer = total / layers;
  std::vector<std::uint64_t> bytes(layers, 0);
  std::uint64_t start = 0;  // of subgroup s
  for (std::size_t s = 0; s < subgroup_params.size(); ++s) {
    const std::uint64_t end = start + subgroup_params[s];
    for (std::uint64_t at = start; !on_gpu[s] && at < end;) {
      const std::size_t layer = std::min<std::size_t>(at / per_layer, layers - 1);
      const std::uint64_t layer_end = layer + 1 == layers ? total : (layer + 1) * per_layer;
      const std::uint64_t n = std::min(end, layer_end) - at;
      bytes[layer] += n * gradient_bytes;
      at += n;
    }
    start = end;
  }
  return bytes;
}

}  // namespace tide::planner
