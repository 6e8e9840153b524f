// The executor: runs one update phase of a plan over an OptimizerState.
//
// GPU subgroups flow through three streams: copy-in (state and, unless kept on the GPU, the
// gradient) on one copy stream, the fused Adam kernel on a compute stream, copy-out of the state
// on a second copy stream, with the plan's D buffers recycled by events (the copy-in of the j-th
// GPU subgroup waits for the copy-out of the (j-D)-th). The kernel writes the low-precision
// weights straight into the model's parameters when the subgroup is one slice, else into the
// buffer and device-to-device copies scatter them. The whole GPU side is enqueued up front (a
// few microseconds), then the calling thread runs the CPU subgroups on the CPU thread pool from
// pinned memory and uploads their weights on an upload stream as each finishes. The phase joins
// on one event per stream: no device-wide synchronisation.
//
// Buffers are kept from one phase to the next (release_buffers() frees them).
// Memory pressure: buffers are allocated as the pipeline is set up; if one cannot be, the GPU
// subgroups that would have used it (and any after, when none was allocated) are updated on the
// CPU instead, the report says so, and the headroom the next plans may use is capped at what
// could be allocated (the cap grows back by a quarter per phase without failure).
//
// Measured times of every subgroup feed a RateRefiner, whose rates plan the next phase.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "allocator/headroom_resource.h"
#include "allocator/memory_resource.h"
#include "driver/context.h"
#include "kernels/adam_math.h"
#include "kernels/cpu_adam.h"
#include "scheduler/gradient_offload.h"
#include "scheduler/optimizer_state.h"
#include "scheduler/plan.h"
#include "scheduler/planner.h"
#include "scheduler/refine.h"
#include "scheduler/update_buffer.h"

namespace tide::kernels {
class AdamGpu;
}

namespace tide::scheduler {

// Which subgroups go to the GPU.
struct Policy {
  enum class Kind : std::uint8_t { automatic, cpu, gpu, interleave };
  Kind kind = Kind::automatic;
  std::size_t k = 0;  // interleave: one GPU subgroup every k (k ≥ 1)

  static Policy automatic_policy() { return {}; }
  static Policy all_cpu() { return {Kind::cpu, 0}; }
  static Policy all_gpu() { return {Kind::gpu, 0}; }
  static Policy every(std::size_t k) { return {Kind::interleave, k}; }
};

// "auto", "cpu", "gpu" or a K ≥ 1 ("2": one GPU subgroup in two). Throws std::invalid_argument.
Policy parse_policy(std::string_view text);
std::string policy_name(const Policy& policy);  // "auto", "cpu", "gpu", "k2"
// TIDE_PLACEMENT if set (strictly parsed; config::EnvError), else `fallback`.
Policy policy_from_env(const Policy& fallback);

struct ExecutorOptions {
  int device = 0;
  std::optional<Rates> rates;  // nullopt: resolve_rates (built-in, calibration file, TIDE_RATE_*)
  // GPU subgroups of a prepared plan keep their gradients on the GPU (offloaded device to device)
  // instead of copying them in from pinned memory with their state.
  bool gradients_on_gpu = false;
  PlannerOptions planner;
  bool refine = true;  // measured times refine the rates
  RefineOptions refine_options;
  unsigned cpu_threads = 0;  // CPU subgroups' update threads; 0: the whole pool
  // The CPU kernel's instruction set instead of the widest one (must be supported): for timing
  // tests and benchmarks that want a slower CPU update against the stand-in's simulated copies.
  std::optional<kernels::CpuIsa> cpu_isa;
  // Where the GPU buffers come from. Null: tide's caching allocator of the device when the
  // process uses it (PyTorch through tide.torch.use_allocator(), which is where the headroom
  // comes from too: the buffers are carved from its cache), else the driver (cuMemAlloc).
  allocator::DeviceMemoryResource* memory = nullptr;
};

struct PhaseReport {
  Plan planned;                 // what the planner chose
  Plan ran;                     // what ran (after any fallback), with the model's prediction
  std::vector<Device> devices;  // by subgroup: where it was updated
  std::vector<SubgroupTiming> timings;
  double seconds = 0;                  // measured, from the first enqueue to the join
  double cpu_seconds = 0;              // the CPU workers' busy time
  std::uint64_t nonfinite = 0;         // elements left unchanged: non-finite gradient or update
  std::size_t fallback_subgroups = 0;  // planned on the GPU, updated on the CPU
  std::uint64_t headroom_cap = 0;      // cap on the next plans' headroom (0: none)
};

class Executor {
 public:
  // Makes the device's primary context current on this thread; callers on other threads call
  // make_current() first.
  Executor(OptimizerState& state, const ExecutorOptions& options = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void make_current() const { context_.make_current(); }
  GradientOffload& offload() { return *offload_; }
  OptimizerState& state() { return state_; }

  // The plan for the next update phase with `headroom_bytes` of GPU memory, computed now (before
  // backward), so that with gradients_on_gpu its GPU subgroups receive their gradients on the
  // GPU: allocates their gradient buffers and routes the offload there. Optional: run() plans
  // itself when no plan was prepared.
  const Plan& prepare(const Policy& policy, std::uint64_t headroom_bytes);

  // One update phase: the prepared plan, or a fresh one for `policy` and `headroom_bytes`.
  // Waits for the offloaded gradients by event. Returns the report (also kept: last_report()).
  const PhaseReport& run(const kernels::AdamHyper& hyper, const Policy& policy,
                         std::uint64_t headroom_bytes);

  // The plan `policy` gives now (no side effects), as prepare() would make it.
  Plan plan_for(const Policy& policy, std::uint64_t headroom_bytes) const;

  // The GPU buffers are kept from one phase to the next (allocating them every phase costs
  // driver calls without tide's allocator, and cuMemFree synchronises on a real GPU): this frees
  // them, e.g. before a forward pass that needs the memory. The next phase allocates them again.
  void release_buffers();

  const PhaseReport& last_report() const { return report_; }
  const Rates& rates() const { return refiner_.rates(); }
  Footprint footprint(bool gradients_on_gpu) const;

 private:
  struct Pipeline;
  void run_gpu_side(Pipeline& p, const kernels::AdamHyper& hyper);
  std::uint64_t capped(std::uint64_t headroom) const;
  Plan plan_with(const Policy& policy, std::uint64_t headroom_bytes, bool gradients_on_gpu) const;
  allocator::DeviceMemoryResource& memory();

  OptimizerState& state_;
  ExecutorOptions options_;
  driver::PrimaryContext context_;
  std::unique_ptr<GradientOffload> offload_;
  std::unique_ptr<kernels::AdamGpu> adam_;
  std::unique_ptr<driver::Stream> h2d_, compute_, d2h_, upload_;
  RateRefiner refiner_;
  std::optional<Plan> prepared_;
  // Before the buffers: they go back to these when they go.
  allocator::DriverResource driver_memory_;
  std::unique_ptr<allocator::HeadroomResource> headroom_memory_;
  std::vector<UpdateBuffer> resident_;  // prepared GPU subgroups' gradients
  std::vector<UpdateBuffer> cached_;    // GPU buffers kept from the last phase
  UpdateBuffer cached_counters_;
  std::uint64_t headroom_cap_ = 0;
  PhaseReport report_;
};

}  // namespace tide::scheduler
