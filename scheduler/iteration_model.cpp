#include "scheduler/iteration_model.h"

#include <algorithm>
#include <stdexcept>

namespace tide::scheduler {

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

}  // namespace tide::scheduler
