// The forward and backward passes of one iteration as the iteration benchmark predicts them,
// next to the update phase's model (planner/performance_model.h): the GPU computes each layer
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

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace tide::planner {

struct LayerTimes {
  double forward_s = 0;
  double backward_s = 0;
  std::uint64_t gradient_bytes = 0;
};

// `layers` in forward order (backward runs them in reverse). `d2h_bytes_per_s` > 0.
double predict_forward(std::span<const LayerTimes> layers);
double predict_backward(std::span<const LayerTimes> layers, double d2h_bytes_per_s, bool blocking);

// The gradient bytes of each of `layers` layers that go to host memory, for parameters laid out
// in subgroups `subgroup_params` (in order) and split into layers of P / layers parameters (the
// last one takes the rest): every element's `gradient_bytes`, but for the subgroups in `kept`,
// whose gradients stay on the GPU (a plan's GPU subgroups with gradients kept there). Throws
// std::invalid_argument for no layers, more layers than parameters, or a subgroup out of range.
std::vector<std::uint64_t> host_gradient_bytes(std::span<const std::uint64_t> subgroup_params,
                                               std::size_t layers, unsigned gradient_bytes,
                                               std::span<const std::size_t> kept = {});

}  // namespace tide::planner
