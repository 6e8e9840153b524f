// A plan: which subgroups an update phase runs on the GPU and which on the CPU, in what order, with
// how many GPU buffers, and what the performance model predicts for it. An executor runs it as is:
// the GPU pipeline takes gpu_order with `buffers` buffers of `buffer_bytes` each (subgroup
// gpu_order[j] uses buffer j % buffers), the CPU workers take cpu_order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "planner/performance_model.h"
#include "planner/rates.h"

namespace tide::planner {

enum class Device : std::uint8_t { cpu, gpu };

const char* device_name(Device device);  // "cpu", "gpu"

// What the planner is given.
struct Workload {
  std::vector<std::uint64_t> subgroup_params;  // each ≥ 1
  // GPU memory the update phase can use (the allocator's headroom forecast).
  std::uint64_t headroom_bytes = 0;
  Footprint footprint;
};

// Limits that keep every byte count exact: subgroups of 1 to 2^40 parameters, at most 2^53 in
// all, 1 to 64 state bytes and 0 to 64 gradient bytes per parameter. Throws
// std::invalid_argument naming what is out of range.
void validate(const Workload& workload);

// The decision alone: the GPU subgroups in pipeline order and the buffers in flight. Every other
// subgroup is updated on the CPU, in increasing index order.
struct Placement {
  std::vector<std::size_t> gpu_order;
  std::size_t buffers = 0;  // ≥ 1 when gpu_order is not empty; more than gpu_order.size() is
                            // clamped to it (extra buffers would never be used)
};

inline constexpr std::size_t kNoBuffer = std::numeric_limits<std::size_t>::max();

struct SubgroupPlan {
  std::uint64_t params = 0;
  Device device = Device::cpu;
  std::size_t position = 0;        // place in its device's order
  std::size_t buffer = kNoBuffer;  // GPU: position % buffers
  // GPU: its state stays in device memory across phases (runtime/residency.h): its update copies
  // no state over the link. plan() places transient subgroups only; resident ones are placed
  // first by plan_around_resident (planner/resident_plan.h).
  bool resident = false;
  // Predicted, seconds from the start of the phase. CPU: update start and end. GPU: copy-in
  // start to copy-out end, with the ends of copy-in and update in between.
  double start_s = 0;
  double h2d_end_s = 0;
  double update_end_s = 0;
  double end_s = 0;
};

struct Prediction {
  double phase_s = 0;     // max(cpu_side_s, gpu_side_s, link_s, host_s)
  double cpu_side_s = 0;  // the CPU workers' busy time
  double gpu_side_s = 0;  // copy-in of the first GPU subgroup to copy-out of the last
  double link_s = 0;      // the host→GPU link's busy time: copy-ins and CPU weight uploads
  double host_s = 0;      // host memory's busy time: the CPU updates' and the copies' bytes
  double all_cpu_s = 0;   // the same phase with every subgroup on the CPU
  double speedup() const { return phase_s > 0 ? all_cpu_s / phase_s : 1.0; }
};

struct Plan {
  std::vector<SubgroupPlan> subgroups;  // by subgroup index
  std::vector<std::size_t> gpu_order;
  std::vector<std::size_t> cpu_order;
  std::size_t buffers = 0;
  std::uint64_t buffer_bytes = 0;    // one buffer: the largest GPU subgroup's copy-in
  std::uint64_t resident_bytes = 0;  // gradients the GPU subgroups keep on the GPU
  // Device memory of the resident subgroups' state slots (SubgroupPlan::resident).
  std::uint64_t resident_state_bytes = 0;
  std::uint64_t headroom_bytes = 0;
  std::uint64_t gpu_params = 0;
  std::uint64_t cpu_params = 0;
  Prediction predicted;
  // Set by the planner when its search was exhaustive: no placement that fits is predicted
  // faster under the model.
  bool optimal = false;

  // GPU memory the plan needs at most: its buffers, the gradients kept on the GPU and the
  // resident state (saturating at the largest uint64_t).
  std::uint64_t gpu_bytes() const;
  bool fits() const { return gpu_bytes() <= headroom_bytes; }
  std::size_t gpu_subgroups() const { return gpu_order.size(); }
};

// The plan of a placement, with the model's prediction and each subgroup's predicted times.
// Throws std::invalid_argument for a malformed placement (an index out of range or repeated, no
// buffer for GPU subgroups). It does not require the placement to fit: see Plan::fits().
Plan evaluate(const Workload& workload, const Rates& rates, const Placement& placement);

// The all-CPU plan.
Plan all_cpu_plan(const Workload& workload, const Rates& rates);

}  // namespace tide::planner
