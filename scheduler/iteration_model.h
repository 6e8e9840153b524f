// The forward and backward passes of one iteration as the iteration benchmark predicts them,
// next to the update phase's model (scheduler/performance_model.h): the GPU computes each layer
// in turn, and the gradients of each layer go to pinned host memory on the GPU-to-host link,
// either as soon as the layer's backward is done (tide's gradient offload: the copies overlap the
// backward of the layers after it) or all at once after the whole backward pass, waited for
// (ZeRO-Offload's blocking copy).
//
//   forward:  F = sum of the layers' forward times
//   backward, offloaded as ready: with c_l the end of layer l's backward (in backward order) and
//             g_l its gradient bytes,  E_l = max(c_l, E_{l-1}) + g_l / B_d;  T = max(c_L, E_L)
//   backward, blocking:  T = c_L + (sum of g_l) / B_d
// What it leaves out: per-copy and per-launch latencies, and the CPU the stand-in's copies take.
#pragma once

#include <cstdint>
#include <span>

namespace tide::scheduler {

struct LayerTimes {
  double forward_s = 0;
  double backward_s = 0;
  std::uint64_t gradient_bytes = 0;
};

// `layers` in forward order (backward runs them in reverse). `d2h_bytes_per_s` > 0.
double predict_forward(std::span<const LayerTimes> layers);
double predict_backward(std::span<const LayerTimes> layers, double d2h_bytes_per_s, bool blocking);

}  // namespace tide::scheduler
