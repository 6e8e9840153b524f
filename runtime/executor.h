// The executor: runs one update phase of a plan over an OptimizerState.
//
// GPU subgroups flow through streams: copy-in of the state and, unless kept on the GPU, of the
// gradient (h2d), the fused Adam kernel (compute), copy-out of the state into a spare
// state slot (d2h), and, once the copy-out is known complete, the write of the new weights into
// the model's parameters (params: device-to-device from the buffer). Each of the plan's D buffers
// is a lane: the next subgroup on a lane starts copying its state and gradient in as soon as the
// lane's last copy-out is done (after a resident update, which copies nothing out of the lane, as
// soon as its kernel is; device-side), while the rest of it (its update, which writes its new
// weights where the last subgroup's wait to be written out; its copy-out) is enqueued once the
// calling thread has committed that last subgroup. The calling thread coordinates: it enqueues,
// commits each GPU subgroup whose copy-out completed (a driver callback wakes it) and writes its
// weights, and uploads the weights of the CPU subgroups, which a worker thread updates in place
// in pinned memory on the CPU thread pool at the same time. No device-wide synchronisation: the
// phase joins on its streams.
//
// A step happens exactly, or not at all. run() first makes sure the step can be completed from
// host memory alone (ready(): the gradients are in pinned memory, work a failed phase left queued
// is done); a failure there leaves everything as it was and is rethrown. After that nothing
// changes a subgroup's state but a commit: a GPU subgroup's result becomes its state only when
// its whole copy-out completed, and the model's parameters are written only from committed state
// (or from a resident update's, which nothing but a lost device can stop once enqueued).
// A fault after that point never leaves a half-made step; what the executor does, by fault:
// - a GPU buffer, its counters or a spare slot cannot be allocated (memory pressure): that
//   subgroup is updated on the CPU instead (fallback_subgroups), later plans get less headroom;
// - any other failed driver call of the GPU side (copy, kernel launch, event, a lost device):
//   no further GPU work is started; subgroups in flight whose copy-out completes are committed,
//   every other GPU subgroup is redone on the CPU from its untouched state (rolled_forward): the
//   same bits, as both sides compute kernels/adam_math.h exactly;
// - a parameter write that fails is retried once synchronously from the committed state; if the
//   device still cannot be written (a lost device), the subgroup is reported `unwritten`: its
//   state is committed and its parameters are to be written from the master weights by the
//   caller (tide.torch does, with torch);
// - a subgroup whose gradient was kept on a lost device (gradients_on_gpu) cannot be redone on
//   the CPU: it is reported `not_updated` (the only outcome that is neither the whole step nor
//   none of it; the caller must restore a checkpoint).
// If the phase's streams cannot be waited for (a lost device), the buffers and spare slots their
// queued work may still write are quarantined, never reused or freed until a later ready()
// waits for that work; queued work only ever writes spare slots, GPU buffers, and the model's
// parameters with committed values.
//
// Pageable subgroups (OptimizerState::pageable: state past the pinned share) are updated on the
// CPU under every policy and are never resident: every plan keeps them there
// (planner/cpu_only.h).
//
// Resident subgroups (ExecutorOptions::residency, runtime/residency.h) are GPU subgroups whose
// state stays in device memory: they are updated in place there (copied in only when joining),
// have no copy-out, and their commit records that the device slot is their state. Once such an
// update is enqueued in place it cannot be undone, so its weights' write is enqueued behind it
// and its lane takes the next subgroup at once, with no host round trip. Run on the CPU
// after a fault, their state is first copied home; a device lost with it loses it since its last
// copy home
// (`not_updated`). docs/design/runtime.md#resident-subgroups.
//
// Buffers are kept from one phase to the next (release_buffers() frees them).
// Memory pressure: buffers are allocated as the pipeline runs; if one cannot be, the GPU
// subgroups that would have used it (and any after, when none was allocated) are updated on the
// CPU instead, the report says so, and the headroom the next plans may use is capped at what
// could be allocated (the cap grows back by a quarter per phase without failure).
//
// Where the model's parameters are (on the device, or host-resident for FSDP2's
// CPUOffloadPolicy) is a part of its own, runtime/model_params.h: how a subgroup's gradient and
// weights are read and how its new weights reach the model; the guarantees above hold for both.
//
// Measured times of every subgroup feed a RateRefiner, whose rates plan the next phase (not after
// a phase with a fault: its times are not the plan's).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "allocator/device/caching_allocator.h"
#include "allocator/memory_resource.h"
#include "driver/context.h"
#include "kernels/adam_math.h"
#include "kernels/cpu_adam.h"
#include "planner/plan.h"
#include "planner/planner.h"
#include "planner/refine.h"
#include "planner/resident_plan.h"
#include "runtime/buffer_pool.h"
#include "runtime/frozen_slices.h"
#include "runtime/gradient_offload.h"
#include "runtime/gradient_stats.h"
#include "runtime/model_params.h"
#include "runtime/optimizer_state.h"
#include "runtime/residency.h"
#include "runtime/update_buffer.h"

namespace tide::kernels {
class AdamGpu;
}

namespace tide::runtime {

class Wakeup;

// Which subgroups go to the GPU.
struct Policy {
  enum class Kind : std::uint8_t { automatic, cpu, gpu, interleave, first };
  Kind kind = Kind::automatic;
  std::size_t k = 0;  // interleave: one GPU subgroup every k (k ≥ 1); first: how many

  static Policy automatic_policy() { return {}; }
  static Policy all_cpu() { return {Kind::cpu, 0}; }
  static Policy all_gpu() { return {Kind::gpu, 0}; }
  static Policy every(std::size_t k) { return {Kind::interleave, k}; }
  // Subgroups 0..n-1 on the GPU (all of them when there are fewer), the rest on the CPU: a
  // static share of the subgroups, as offloading systems that fix the GPU's ratio do (the
  // iteration benchmark's Twin-Flow-style configurations). Not a TIDE_PLACEMENT value.
  static Policy first(std::size_t n) { return {Kind::first, n}; }
};

// "auto", "cpu", "gpu" or a K ≥ 1 ("2": one GPU subgroup in two). Throws std::invalid_argument.
Policy parse_policy(std::string_view text);
std::string policy_name(const Policy& policy);  // "auto", "cpu", "gpu", "k2", "first3"
// TIDE_PLACEMENT if set (strictly parsed; config::EnvError), else `fallback`.
Policy policy_from_env(const Policy& fallback);
// TIDE_RESIDENCY: "auto" (the default: resident subgroups where memory allows) or "off".
bool residency_from_env();
// Parameters per chunk of a GPU subgroup's copies and update (ExecutorOptions::gpu_chunk_params):
// 4Mi, 56 MiB of fp32 state and bf16 gradient, about 1 ms over a 55 GB/s link.
inline constexpr std::uint64_t kDefaultGpuChunkParams = std::uint64_t{4} << 20;
// A subgroup is split into at most this many chunks, however small the chunks asked for: each
// costs a launch and a few events.
inline constexpr std::uint64_t kMaxGpuChunks = 64;
// TIDE_GPU_CHUNK if set (strictly parsed; config::EnvError), else kDefaultGpuChunkParams.
std::uint64_t gpu_chunk_from_env();

// Where a prepared plan's GPU subgroups take their gradients from (tide_optimizer_options::
// gradients_on_gpu): pinned memory (no); the GPU, offloaded there only (yes: a device lost before
// the step loses them, TIDE_STEP_INCOMPLETE); or (automatic) the GPU where the model predicts the
// phase no slower that way than with the update's own headroom and tide's allocator can take the
// buffers back from a forward pass past its forecast, offloaded to pinned memory too, so that
// the step can still redo them on the CPU (the update saves their copy in, not the backward
// pass's copy out).
enum class KeptGradients { no, yes, automatic };

struct ExecutorOptions {
  int device = 0;
  std::optional<planner::Rates>
      rates;  // nullopt: resolve_rates (built-in, calibration file, TIDE_RATE_*)
  // The CPU update's rate by state format against fp32 state's (planner/cpu_update_factors.h).
  // nullopt: the calibration file's when `rates` is nullopt too, else none (the model's factor).
  std::optional<planner::CpuUpdateFactors> cpu_update_factors;
  // Whether GPU subgroups of a prepared plan keep their gradients on the GPU (offloaded device
  // to device) instead of copying them in from pinned memory with their state.
  KeptGradients gradients_on_gpu = KeptGradients::no;
  planner::PlannerOptions planner;
  bool refine = true;  // measured times refine the rates
  planner::RefineOptions refine_options;
  unsigned cpu_threads = 0;  // CPU subgroups' update threads; 0: the whole pool
  // The CPU kernel's instruction set instead of the widest one (must be supported): for timing
  // tests and benchmarks that want a slower CPU update against the stand-in's simulated copies.
  std::optional<kernels::CpuIsa> cpu_isa;
  // Placement "auto" keeps the state of as many subgroups in device memory across phases as the
  // memory that can be held through a whole iteration allows (runtime/residency.h,
  // planner/residency.h). Off here by default; the C ABI takes it from TIDE_RESIDENCY.
  bool residency = false;
  // The band both residency choices keep: the set (planner::ResidencyInput::hysteresis) and
  // residency against none (planner::prefer_resident).
  double residency_hysteresis = 0.05;
  // A GPU subgroup's copies and update go in chunks of this many parameters (a multiple of
  // kernels::kQuantBlock): a chunk's update starts once its copy-in is done and its copy-out once
  // its update is, so each end of the pipeline waits for one chunk, not one subgroup. Resident
  // subgroups, updated in place, are one chunk; no subgroup is more than kMaxGpuChunks. The C
  // ABI takes it from TIDE_GPU_CHUNK.
  std::uint64_t gpu_chunk_params = kDefaultGpuChunkParams;
  // How long a phase's coordinating thread sleeps when nothing wakes it: a lost device runs no
  // callback, so it polls now and then to find out. No healthy phase waits for it (tests make it
  // long to prove that).
  std::chrono::microseconds poll_interval{20000};
  // Where the GPU buffers come from. Null: tide's caching allocator of the device when the
  // process uses it (PyTorch through tide.torch.use_allocator(), which is where the headroom
  // comes from too: the buffers are carved from its cache), else the driver (cuMemAlloc).
  allocator::DeviceMemoryResource* memory = nullptr;
};

struct PhaseReport {
  planner::Plan planned;  // what the planner chose
  // What ran (after any fallback), with the model's prediction: resident updates first on the
  // GPU side (a joining state's copy in included), then the copied-in subgroups and the CPU's.
  planner::Plan ran;
  std::vector<planner::Device> devices;  // by subgroup: where it was updated
  std::vector<planner::SubgroupTiming> timings;
  // By subgroup: when its CPU update ran, on the steady clock (the one the stand-in driver's
  // recorded timeline uses: tests prove overlap by order with both); default (the clock's epoch)
  // for a subgroup not updated on the CPU.
  struct Span {
    std::chrono::steady_clock::time_point start, end;
  };
  std::vector<Span> cpu_spans;
  // By subgroup: for one that left residency in this phase, when its state was sent home (the
  // copy enqueued) and when the phase saw it there; the clock's epoch for the others.
  std::vector<Span> home_spans;
  double seconds = 0;      // measured, from the first enqueue to the join
  double cpu_seconds = 0;  // the CPU workers' busy time
  // The GPU subgroups' update kernels, copies in and copies out of their state (resident ones
  // included), as their events timed them, summed: each runs on one stream, so these are each
  // stream's busy time (what the phase spent beyond them went to waits and the host).
  double gpu_seconds = 0, h2d_seconds = 0, d2h_seconds = 0;
  std::uint64_t nonfinite = 0;           // elements left unchanged: non-finite gradient or update
  std::size_t fallback_subgroups = 0;    // planned on the GPU, updated on the CPU
  std::uint64_t headroom_cap = 0;        // cap on the next plans' headroom (0: none)
  std::size_t rolled_forward = 0;        // GPU subgroups redone on the CPU after a fault
  std::string fault;                     // the first fault of the phase (empty: none)
  std::vector<std::size_t> unwritten;    // updated, but their model parameters were not written
  std::vector<std::size_t> not_updated;  // not updated: their gradient was lost with the device
  // GPU subgroups whose gradient was on the GPU when the phase began (a prepared plan's kept
  // gradients, a resident subgroup's): their update copied none in.
  std::size_t kept_gradients = 0;
  std::size_t resident_subgroups = 0;  // resident after the phase (their state on the device)
  std::uint64_t resident_bytes = 0;    // device memory their state holds
  // Since the previous phase (the forward and backward passes between them): memory pressure on
  // resident state. Subgroups the allocator took back home because an allocation would have
  // failed (its reclaimer), their bytes and the time it spent on it inside those allocations;
  // and allocations tide's allocator served only by giving its cache back to the driver (a
  // synchronize, unmaps and maps again), counted whatever was resident. Before any state, the
  // reclaimer gives back a prepared plan's kept gradients that no gradient had reached yet (their
  // subgroups' gradients went to pinned memory instead, and the phase updates them on the CPU).
  struct Pressure {
    std::size_t evicted_subgroups = 0;
    std::uint64_t evicted_bytes = 0;
    double evict_seconds = 0;
    std::uint64_t cache_releases = 0;
    std::size_t withdrawn_gradients = 0;
    std::uint64_t withdrawn_bytes = 0;
  };
  Pressure pressure;
};

class Executor {
 public:
  // Any thread may call; each call that needs the device makes its primary context current for
  // the call and leaves the caller's current context as it was (driver/context.h).
  Executor(OptimizerState& state, const ExecutorOptions& options = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  const driver::PrimaryContext& context() const { return context_; }
  // Its calls need the device's context current (a driver::ContextScope of context()).
  GradientOffload& offload() { return *offload_; }
  OptimizerState& state() { return state_; }

  // The plan for the next update phase with `headroom_bytes` of GPU memory (what may be held
  // through the coming passes), computed now (before backward), so that with gradients_on_gpu its
  // GPU subgroups receive their gradients on the GPU: allocates their gradient buffers and routes
  // the offload there. Optional: run() plans itself when no plan was prepared. Returns the plan,
  // or nullptr where KeptGradients::automatic found keeping them not worth it (run() plans then,
  // with the update's headroom).
  const planner::Plan* prepare(const Policy& policy, std::uint64_t headroom_bytes);

  // Everything the step needs before it can change anything: checks `hyper`, waits for the
  // gradients offloaded so far and for work a failed phase left queued. Throws when it cannot
  // (nothing changed). Optional (run() calls it when needed): callers that step several
  // executors as one step call it on all of them first, so that none starts when one cannot.
  void ready(const kernels::AdamHyper& hyper);

  // One update phase: the prepared plan, or a fresh one for `policy` and `headroom_bytes`.
  // Throws only before anything changed (ready(), a bad policy or hyperparameters, no memory
  // for the frozen slices' saved state); every later fault is handled as described above and
  // reported. Returns the report (also kept: last_report()).
  const PhaseReport& run(const kernels::AdamHyper& hyper, const Policy& policy,
                         std::uint64_t headroom_bytes);

  // Frozen slices (their parameters had no gradient this step, as torch.optim leaves such
  // parameters untouched): the phase leaves their elements exactly as they were, state and
  // model parameters. `slice` is the slice's position in spec(subgroup).slices. Kept until
  // changed.
  void set_frozen(std::size_t subgroup, std::size_t slice, bool frozen) {
    frozen_.set(subgroup, slice, frozen);
  }
  bool frozen(std::size_t subgroup, std::size_t slice) const {
    return frozen_.frozen(subgroup, slice);
  }

  // Host-resident parameters: the gradient of `slice` (its position in spec(subgroup).slices)
  // for the coming step, `count` elements of the state's gradient dtype at host address
  // `grad`; null: none (the slice must then be frozen). Read by grad_stats and the next run()
  // (which forgets them when it returns: the memory is the caller's). ready() throws for a slice
  // neither frozen nor given a gradient.
  void set_host_gradient(std::size_t subgroup, std::size_t slice, const void* grad);
  const void* host_gradient(std::size_t subgroup, std::size_t slice) const;
  // Sum of squares and non-finite count of the gradients the coming step reads (host-resident:
  // where they are; else the pinned buffers, after waiting for the offloads).
  GradientStats gradient_stats() const;

  // Writes the model's parameters of subgroup s from its committed master weights, now
  // (synchronously, after any work a failed phase left queued), skipping frozen slices. Throws
  // CudaError when the device fails; parameters in host memory (ModelParams::
  // writes_without_device) are written without it. tide is their one writer.
  void write_params(std::size_t s);

  // The plan `policy` gives now (no side effects), as prepare() would make it.
  planner::Plan plan_for(const Policy& policy, std::uint64_t headroom_bytes) const;

  // The GPU buffers are kept from one phase to the next (allocating them every phase costs
  // driver calls without tide's allocator, and cuMemFree synchronises on a real GPU): this frees
  // them, e.g. before a forward pass that needs the memory. The next phase allocates them again.
  // After a phase whose work could not be waited for, it waits for it first (throws if it still
  // cannot: nothing is freed under queued work).
  void release_buffers();

  // Resident state (ExecutorOptions::residency): makes every resident subgroup's pinned slot
  // current (a copy from the device, synchronously), for readers of the state between steps.
  // `written`: the caller may write the pinned slots, which are then the state (the next update
  // of each copies its state in from there). Throws CudaError when the device fails; the state
  // since the last such copy is then on the lost device only.
  void sync_state(bool written);
  // Ends the residency of every subgroup (its state goes back to its pinned slot) and frees the
  // device memory it held; `max_bytes`: stop once that much was freed. Returns the bytes freed.
  // Throws CudaError as sync_state does.
  std::uint64_t evict(std::uint64_t max_bytes = UINT64_MAX);
  const Residency& residency() const { return residency_; }

  const PhaseReport& last_report() const { return report_; }
  const planner::Rates& rates() const { return refiner_.rates(); }
  planner::Footprint footprint(bool gradients_on_gpu) const;

 private:
  struct Phase;
  struct GpuTask;
  struct Lane;
  // Waits for work an earlier phase left unconfirmed, then frees what it held. Throws if the
  // device still cannot be waited for.
  void settle();
  // Waits for the gradient offload's and the phase's streams. Throws if the device cannot.
  void synchronize_streams() const;
  bool needs_staging() const;
  std::uint64_t capped(std::uint64_t headroom) const;
  // KeptGradients::automatic: the plan keeping its GPU subgroups' gradients within `holdable`,
  // where the model predicts it no slower than the plan without them within the update's own
  // forecast headroom; nullopt where not (or where there is no forecast).
  std::optional<planner::Plan> plan_keeping_gradients(const Policy& policy, std::uint64_t holdable,
                                                      std::uint64_t held);
  // prepare() under KeptGradients::automatic where nothing is kept: no plan (run() plans with the
  // update's headroom), the offload routed as after the last phase. Returns nullptr.
  const planner::Plan* prepare_nothing();
  // `held_bytes`: what may be held through a whole iteration, for resident subgroups (0: none).
  planner::Plan plan_with(const Policy& policy, std::uint64_t headroom_bytes, bool gradients_on_gpu,
                          std::uint64_t held_bytes = 0) const;
  // The plan around the subgroups `resident` marks (planner/resident_plan.h): their states not
  // on the device yet (joining, or their pinned slots written since) and gradients not kept
  // there are copied in first, as the phase does.
  planner::ResidentPlan plan_around_resident(const planner::Workload& w,
                                             const std::vector<char>& resident) const;
  std::vector<std::uint64_t> slot_sizes() const;  // by subgroup: its state slot's bytes
  std::vector<char> choose_resident(const Policy& policy, std::uint64_t held_bytes) const;
  std::uint64_t resident_working_bytes() const;
  // The lane a resident subgroup of `params` parameters is updated through.
  std::uint64_t lane_bytes_for(std::uint64_t params) const;
  // By subgroup, whether it may be updated on the GPU (not when its state is pageable); empty:
  // all may.
  std::vector<char> gpu_allowed() const;
  // A subgroup leaving residency: the copy of its state home is enqueued, `arrived` recorded
  // after it, and its device slot held until the phase sees that event done.
  struct Homeward {
    std::size_t subgroup = 0;
    driver::Event arrived;
    std::chrono::steady_clock::time_point sent;
  };
  // Residents the plan does not keep are sent back to their pinned slots, without waiting: the
  // phase hands each to the CPU once its copy is done, and starts GPU work once all are. Those
  // with frozen slices (saved from the pinned slot before the phase) are waited for here. Those
  // whose copy cannot be enqueued (a failed device) stay resident in `plan` for this phase.
  // `wakeup` is notified as each copy completes.
  std::vector<Homeward> send_unplanned_home(planner::Plan& plan,
                                            const std::shared_ptr<Wakeup>& wakeup);
  // residency_budget, or nothing when the allocator cannot be asked (a lost device).
  std::uint64_t residency_held(std::uint64_t headroom_bytes);
  // After a phase: the next backward pass offloads resident subgroups' gradients into GPU
  // buffers (held until the next phase) instead of pinned memory, so that they never cross the
  // link. Without memory for them, they go to pinned memory as before.
  void keep_resident_gradients();
  // Frozen slices have no gradient this step: in a kept GPU gradient their elements are zeroed,
  // as save() zeroes them in pinned buffers (so that their update is finite, then undone).
  void zero_frozen_kept_gradients();
  std::uint64_t evict_locked(std::uint64_t max_bytes);
  // The reclaimer's first resort: frees a prepared plan's kept gradients that no gradient has
  // reached yet, the last subgroups first, until `max_bytes` (GradientOffload::
  // withdraw_unwritten). Returns the bytes.
  std::uint64_t withdraw_kept_gradients_locked(std::uint64_t max_bytes);
  // A residency budget unit of subgroup s: its state slot and its kept gradient.
  std::uint64_t resident_cost(std::size_t s) const;
  // The allocator took resident state back (its forecast left too little): the budget is capped
  // at what stayed, less `give_back`, so that the evicted state does not rejoin at the next phase
  // only to be evicted again in the forward pass.
  void note_pressure_locked(std::uint64_t give_back = 0);
  // Before a phase's plan: if, since the last phase, the allocator served an allocation only by
  // giving its cache back to the driver while state was resident (live bytes fitted, what
  // fragmentation reserves did not: the forecast cannot see it), the residency budget gives up a
  // quarter of the resident state (at least one subgroup), as after a reclaim.
  // Returns the allocator's cache releases since the last phase.
  std::uint64_t note_released_cache_locked();
  // After a phase: once quiet_needed_ phases have passed without pressure, the cap grows by a
  // quarter (at least one subgroup) each phase, and goes once it no longer binds. Pressure that
  // follows such growth doubles quiet_needed_ (up to kMaxQuietPhases): a forecast that keeps
  // missing the same pressure costs one eviction per many phases, not one per step.
  void relax_pressure();
  // After buffers or slots were freed: waits for the phase's streams, then lets the allocator
  // hand the freed blocks to any stream (CachingAllocator::streams_waited), so that the next
  // forward pass reuses them instead of growing the cache beside them (under a cap, growing
  // ends in the allocator giving its whole cache back). Nothing if the streams cannot be waited.
  void hand_freed_blocks_over();
  void write_params_locked(std::size_t s);
  // With resident state or kept gradients under tide's allocator: it may take them back before
  // an allocation would fail (CachingAllocator::add_reclaimer).
  void offer_to_reclaim();

  OptimizerState& state_;
  ExecutorOptions options_;
  driver::PrimaryContext context_;
  std::unique_ptr<GradientOffload> offload_;
  std::unique_ptr<kernels::AdamGpu> adam_;
  // From the device's stream pool (driver/stream_pool.h): they outlive the executor, as the
  // allocator's cached blocks and PyTorch's record_stream need.
  const driver::Stream *h2d_ = nullptr, *compute_ = nullptr, *d2h_ = nullptr, *params_ = nullptr,
                       *upload_ = nullptr;
  planner::RateRefiner refiner_;
  std::optional<planner::Plan> prepared_;
  BufferPool buffers_;
  // The events of the last phases that ended with their streams waited for, reused by the next
  // ones: timing events (a GPU subgroup's, eight or more) and plain ones (a lane's). Created and
  // destroyed in every phase they would cost the host two driver calls each, the destroys at
  // the end of the phase's critical path.
  std::vector<driver::Event> spare_events_, spare_lane_events_;
  driver::Event spare_event(driver::Event::Timing timing);
  Residency residency_;
  // Held by a phase, and by whatever moves resident state between phases; tide's allocator's
  // reclaimer only tries it (a phase in progress gives nothing back).
  std::mutex residency_mutex_;
  allocator::device::CachingAllocator* reclaimed_from_ = nullptr;
  std::uint64_t reclaimer_ = 0;
  std::uint64_t headroom_cap_ = 0;
  // Under residency_mutex_: the residency budget's cap after a reclaim (none: no pressure seen),
  // and whether the allocator reclaimed since the last phase.
  std::optional<std::uint64_t> pressure_budget_;
  bool reclaimed_ = false;
  PhaseReport::Pressure evicted_;  // the reclaimer's evictions since the last phase
  int quiet_phases_ = 0;           // phases since the last reclaim
  static constexpr int kQuietPhases = 8;
  static constexpr int kMaxQuietPhases = 64;
  int quiet_needed_ = kQuietPhases;
  bool relaxed_ = false;  // the cap grew (or went) since the last pressure
  // The allocator's Usage::cache_releases after the last phase (none yet: since the executor
  // was made, or since it first saw tide's allocator).
  std::optional<std::uint64_t> cache_releases_seen_;
  PhaseReport report_;
  FrozenSlices frozen_;
  std::unique_ptr<ModelParams> model_params_;  // where the model's parameters are
  // bf16 master weights: per subgroup, whether the model's parameters may not hold the state's
  // weights (never written yet, or their last write failed). A GPU subgroup whose parameters do
  // hold them copies them on the device instead of from host memory.
  std::vector<char> stale_params_;
  bool ready_ = false;                // ready() ran, with no offload since
  std::uint64_t ready_offloads_ = 0;  // the offload count it saw
};

}  // namespace tide::runtime
