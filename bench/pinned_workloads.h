// Request sequences for bench_pinned: what a trainer asks of pinned host memory.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace tide::bench {

// One step of a workload: allocate `bytes` as buffer `id`, or free buffer `id`.
struct PinnedOp {
  bool allocate;
  std::size_t id;
  std::size_t bytes;
};

struct PinnedWorkload {
  std::string name;
  std::string description;
  std::vector<PinnedOp> ops;
};

// Optimizer state: subgroups of `params` parameters (0: drawn between 1e7 and 1e8), three fp32
// buffers each (master weights, two moments), until about `total_bytes`.
PinnedWorkload subgroup_workload(const std::string& name, std::size_t params,
                                 std::size_t total_bytes);

// bf16 gradient buffers of a GPT-like model (one per parameter tensor, from 4 KiB biases to
// 128 MiB embeddings), then staging buffers of mixed sizes allocated and freed in turn.
PinnedWorkload grad_staging_workload();

}  // namespace tide::bench
