// Generated allocation traces shaped like transformer training, with known iteration and phase
// boundaries: for tests of the phase detector and headroom forecast, and for the benchmark.
//
// One iteration, as PyTorch runs it (bf16 activations and weights, tied embeddings):
//  - forward: per layer, the activations autograd keeps (layer norms, qkv, attention output,
//    projection, MLP in and out) plus a short-lived temporary; then the logits and a transient
//    fp32 softmax for the loss. Memory climbs.
//  - backward: the logits' gradient, then per layer in reverse: input gradients (short-lived),
//    the layer's weight gradients (kept), and the layer's activations freed. Memory falls.
//  - update: per parameter group, two fp32 temporaries (as a fused optimizer step uses), then
//    zero_grad(set_to_none) frees the gradients. Memory is at its lowest between iterations.
// Weights are allocated once, before the first iteration.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "allocator/telemetry/trace.h"

namespace tide::allocator::telemetry {

struct TransformerShape {
  std::string name;
  int layers = 12;
  int hidden = 768;
  int seq = 1024;
  int batch = 4;
  int vocab = 50257;
  int heads = 12;
};

// gpt-tiny, gpt2-small, gpt2-medium, gpt-1.3b (batch 1).
std::vector<TransformerShape> standard_shapes();
// Throws std::invalid_argument for an unknown name.
TransformerShape shape_named(const std::string& name);

struct SyntheticOptions {
  int iterations = 20;
  bool marks = true;         // phase marks (forward, backward, update, end) in the trace
  double time_jitter = 0.0;  // each step's duration varies by up to this fraction
  double size_jitter = 0.0;  // each iteration's sequence length varies by up to this fraction
  std::uint64_t seed = 1;
  std::uint64_t layer_ns = 1'000'000;  // forward time of one layer (backward: twice that)
  std::uint64_t group_bytes = std::uint64_t{100} << 20;  // update temporaries per group, about
};

struct SyntheticTrace {
  Trace trace;
  // Per iteration: its first forward allocation, the start of backward, the start of the update
  // and the last free of the update (zero_grad).
  std::vector<std::uint64_t> iteration_start_ns;
  std::vector<std::uint64_t> backward_start_ns;
  std::vector<std::uint64_t> update_start_ns;
  std::vector<std::uint64_t> update_end_ns;
  std::uint64_t allocations_per_iteration = 0;
};

SyntheticTrace generate_transformer_trace(const TransformerShape& shape,
                                          const SyntheticOptions& options);

}  // namespace tide::allocator::telemetry
