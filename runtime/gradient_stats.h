// Statistics of the offloaded gradients for a loss scaler (any non-finite?) and for gradient
// clipping (the total norm), read from the pinned gradient buffers once every offload is done.
//
// Why not during the offload itself: the copies land in host memory on the copy engine, so the
// only place to read them is the CPU, and reading each as it lands would need a host thread per
// copy event during backward. One parallel pass at the start of step() reads 2 bytes per
// parameter (bf16) against the ~30 an Adam update moves, a few percent of the update phase.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/gradient_offload.h"
#include "runtime/optimizer_state.h"

namespace tide::runtime {

struct GradientStats {
  double sum_squares = 0;       // over the finite elements, as stored (still loss-scaled)
  std::uint64_t nonfinite = 0;  // NaN or ±inf elements
};

// Waits for every offloaded gradient, then reads them on the CPU thread pool. Gradients kept on
// the GPU (gradients_on_gpu) are copied into their pinned buffers first (synchronously: the
// statistics cost that copy for them).
GradientStats gradient_stats(const OptimizerState& state, const GradientOffload& offload);

// The same over gradients in host memory: `count` elements of `dtype` at each `data`.
struct GradientPiece {
  const void* data = nullptr;
  std::uint64_t count = 0;
};
GradientStats gradient_stats(const std::vector<GradientPiece>& pieces, kernels::Dtype dtype);

}  // namespace tide::runtime
