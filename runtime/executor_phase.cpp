// Executor::run: one update phase. executor.h describes the pipeline, the commit point and what
// happens on each kind of fault; this file is the coordinating thread's side of it.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>

#include "allocator/pinned/arena.h"
#include "driver/error.h"
#include "driver/memory.h"
#include "kernels/adam_gpu.h"
#include "kernels/cpu_adam.h"
#include "runtime/cpu_worker.h"
#include "runtime/executor.h"
#include "runtime/memory_pressure.h"
#include "runtime/wakeup.h"

namespace tide::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Events of one GPU subgroup: its copy-in's start and end and its copy-out's end; then, per
// chunk, when its copy-in is done and its update's and copy-out's start and end.
enum Stage { kH2dStart, kH2dEnd, kD2hEnd, kStages };
enum ChunkStage { kChunkIn, kUpdateStart, kUpdateEnd, kOutStart, kOutEnd, kChunkStages };

std::string what_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace

// A GPU subgroup started in this phase.
struct Executor::GpuTask {
  std::size_t subgroup = 0;
  std::size_t buffer = 0;    // its lane
  std::size_t events = 0;    // its first event (kStages, then kChunkStages per chunk)
  std::size_t chunks = 1;    // of its copies and update (ExecutorOptions::gpu_chunk_params)
  std::uint64_t chunk = 0;   // parameters per chunk (the last one may have fewer)
  std::size_t counter = 0;   // its first nonfinite counter: one per chunk
  float* slot = nullptr;     // the spare its copy-out writes (taken when the copy-out is enqueued)
  void* staging = nullptr;   // pinned, where the copy-out writes the new weights (if any)
  CUdeviceptr grad = 0;      // where its gradient is on the GPU
  CUdeviceptr weights = 0;   // where the kernel leaves the new weights for the model
  bool grad_copied = false;  // its gradient is copied in (not kept on the GPU)
  // Resident, its state copied in (joining, or its pinned slot written since).
  bool state_copied = false;
  // Resident (runtime/residency.h): its state is updated in place in its device slot, not in
  // the lane's buffer, and never copied out.
  bool resident = false;
  bool kernel_enqueued = false;  // its update will happen unless the device fails
  CUdeviceptr state = 0;         // where its state is updated: its device slot, or the lane's
  // Resident, its pinned slot stale: nothing can undo its update once enqueued, so its new
  // weights' write is enqueued right behind the kernel, not at its commit, and its lane takes
  // the next subgroup at once (no host round trip between resident updates).
  bool written_early = false;
  bool write_failed = false;  // that write could not be enqueued: retried at the join
  // Resident and written early, by its kernel itself: one launch over the model's slices, each
  // with its new weights' place in the model (ModelParams::kernel_writes), so no copy follows.
  bool writes_model = false;
  std::size_t counters = 1;  // its nonfinite counters: one per chunk, or per slice (writes_model)
};

// One GPU buffer and the subgroups that use it in turn.
struct Executor::Lane {
  std::optional<GpuTask> running;  // enqueued through its copy-out, not yet committed
  std::optional<GpuTask> next;     // its state being copied in, the rest waits for `running`
  // After this event (an index into the phase's events) nothing enqueued so far reads what a
  // copy-in writes into the buffer: the last copy-out's end, or a resident update's kernel end
  // (its copy-out reads nothing of the buffer).
  std::optional<std::size_t> reusable;
  driver::Event written;  // after the last parameter write from the buffer
  bool written_recorded = false;
  explicit Lane(driver::Event written_event) : written(std::move(written_event)) {}
};

// One phase, from the coordinating (calling) thread.
struct Executor::Phase {
  Phase(Executor& executor, const kernels::AdamHyper& step_hyper, PhaseReport& phase_report,
        bool gradients_kept_on_gpu, std::shared_ptr<Wakeup> phase_wakeup,
        std::vector<Homeward> sent_home)
      : x(executor),
        state(executor.state_),
        hyper(step_hyper),
        report(phase_report),
        gradients_on_gpu(gradients_kept_on_gpu),
        wakeup(std::move(phase_wakeup)),
        homeward(std::move(sent_home)) {}

  // `no_context`: the device's context could not be made current (a lost device): every
  // subgroup is updated on the CPU.
  void run(const std::exception_ptr& no_context);

  // The GPU side.
  void set_up_gpu();
  bool start_next();
  bool poll();
  GpuTask make_task(std::size_t lane);
  void copy_in(GpuTask& t);
  void copy_state_chunk(const GpuTask& t, ModelParams::Range r, bool weights_on_device);
  kernels::AdamGpuSubgroup adam_range(const GpuTask& t, std::uint64_t first,
                                      std::uint64_t count) const;
  void launch_adam(std::span<const kernels::AdamGpuSubgroup> subs, CUdeviceptr nonfinite) const;
  void update_chunk(const GpuTask& t, std::size_t c);
  void update_into_model(const GpuTask& t);
  void copy_out_chunk(const GpuTask& t, std::size_t c);
  void update_and_copy_out(GpuTask& t);
  void write_early(GpuTask& t);
  // A resident update enqueued in place over the only current copy of its state: nothing can
  // redo it elsewhere, and nothing but a lost device stops it.
  bool updated_for_good(const GpuTask& t) const {
    return t.resident && t.kernel_enqueued && !residency.host_current(t.subgroup);
  }
  void finish(GpuTask t);
  void abandon(const GpuTask& t, bool memory);
  void complete_in_place(const GpuTask& t);
  void drop_waiting();
  bool any_waiting() const;
  void commit(const GpuTask& t);
  // The CPU side.
  std::uint64_t update_on_cpu(std::size_t s) const;
  void to_cpu(std::size_t s);
  void fall_back(std::size_t s);
  void roll_forward(std::size_t s);
  void settle_copy_in(const GpuTask& t);
  void take_cpu_results();
  // Leaving residency: the subgroups whose state arrived home leave their device slots, and
  // those planned on the CPU go to it.
  void take_arrivals();
  bool is_homeward(std::size_t s) const;
  // Faults.
  void fault(const std::exception_ptr& error);
  void device_failed(const std::exception_ptr& error);
  // The end.
  void join();
  void release(bool confirmed);

  Executor& x;
  OptimizerState& state;
  const kernels::AdamHyper& hyper;
  PhaseReport& report;
  const bool gradients_on_gpu;
  // The new low-precision weights are a copy of their own, staged in the buffer
  // (Executor::needs_staging); else the state itself: fp32 parameters, or bf16 master weights at
  // the slot's start.
  const bool low = x.needs_staging();
  const bool bf16_master = state.bf16_master();
  const unsigned gs = state.grad_bytes();
  const unsigned ps = state.param_bytes();
  ModelParams& model = *x.model_params_;
  const unsigned wb = model.weight_bytes_in_buffer();  // the weights, after the state slot

  std::shared_ptr<Wakeup> wakeup;
  std::unique_ptr<CpuWorker> worker;
  // Sent home before the phase, not yet seen there (GPU work starts once none is left), and
  // those of them planned on the CPU.
  std::vector<Homeward> homeward;
  std::vector<std::size_t> awaiting_cpu;
  bool gpu_stopped = false;   // a fault: no more GPU work is started
  bool device_usable = true;  // false once a wait or query failed: no driver call but the join
  bool allocation_failed = false;
  std::uint64_t allocated_bytes = 0;  // GPU memory the phase held

  // GPU side.
  std::vector<std::size_t> order;  // planned
  std::size_t next = 0;            // the next of `order` to start
  std::size_t buffers_cap = 0;     // buffers it may have (fewer after a failed allocation)
  std::uint64_t buffer_bytes = 0;
  // A buffer holds the state, then the gradient, then any staging area, each sized for the
  // largest GPU subgroup: a lane's next subgroup copies its state and gradient in while the last
  // one's new weights still wait in the staging area, whatever their sizes.
  std::uint64_t largest = 0;
  // The buffer holds the state slot, then any weights (wb), then the gradient.
  std::uint64_t params_at() const { return state.slot_bytes_for(largest); }
  std::uint64_t grad_at() const { return params_at() + wb * largest; }
  void free_staging(const GpuTask& t);
  std::vector<UpdateBuffer> buffer;
  std::deque<Lane> lanes;  // one per buffer (a deque: they never move)
  UpdateBuffer counters;   // one nonfinite counter per chunk of a planned GPU subgroup
  std::uint64_t* host_counters = nullptr;  // pinned
  std::size_t host_counter_count = 0;
  std::vector<std::size_t> first_counter;  // by position in `order`
  // A task's events: kStages, then kChunkStages per chunk (a deque: they never move, and are
  // not contiguous).
  std::deque<driver::Event> events;
  driver::Event& event(const GpuTask& t, Stage k) { return events[t.events + k]; }
  static std::size_t chunk_event_at(const GpuTask& t, std::size_t c, ChunkStage k) {
    return t.events + kStages + c * kChunkStages + k;
  }
  driver::Event& chunk_event(const GpuTask& t, std::size_t c, ChunkStage k) {
    return events[chunk_event_at(t, c, k)];
  }
  ModelParams::Range range(const GpuTask& t, std::size_t c) const {
    const std::uint64_t first = c * t.chunk;
    return {first, std::min(t.chunk, state.params(t.subgroup) - first)};
  }
  // Chunks of a subgroup of n parameters: a resident one is updated in place, so in one launch
  // (see complete_in_place); the others in at most kMaxGpuChunks, whatever the option says.
  std::uint64_t chunk_params(std::uint64_t n, bool resident) const {
    if (resident) return std::max<std::uint64_t>(n, 1);
    constexpr std::uint64_t q = kernels::kQuantBlock;
    const std::uint64_t fewest = (n + kMaxGpuChunks * q - 1) / (kMaxGpuChunks * q) * q;
    return std::max(x.options_.gpu_chunk_params, fewest);
  }
  std::size_t chunks_of(std::uint64_t n, bool resident) const {
    const std::uint64_t c = chunk_params(n, resident);
    return std::max<std::uint64_t>((n + c - 1) / c, 1);
  }
  // Whether a resident subgroup's kernel can write its new weights into the model: a copy of
  // their own, its slices in one launch, whole moments (8-bit ones are blocks across slices).
  bool kernel_may_write_model(std::size_t s, bool resident) const {
    return resident && low && !state.quantized() && wb == 0 &&
           state.spec(s).slices.size() <= kernels::kMaxAdamKernelSubgroups &&
           model.kernel_writes(s);
  }
  // Whether writing a resident subgroup's weights into the model keeps the kernel's vector path
  // (kernels/adam_kernel.h) where the whole subgroup has it: the model's tensors need not sit at
  // the state's offsets modulo 8 elements, and a slice that does not goes one element at a time.
  bool keeps_vector_path(const GpuTask& t) const {
    GpuTask in_slot = t;
    in_slot.state = residency.device_slot(t.subgroup);
    auto head = [&](std::uint64_t first, std::uint64_t count, CUdeviceptr copy) {
      const kernels::AdamGpuSubgroup sub = adam_range(in_slot, first, count);
      const kernels::AdamKernelSubgroup k{.grad = sub.grad,
                                          .param = sub.param,
                                          .exp_avg = sub.exp_avg,
                                          .exp_avg_sq = sub.exp_avg_sq,
                                          .param_copy = copy,
                                          .count = count,
                                          .exp_avg_scale = 0,
                                          .exp_avg_sq_scale = 0,
                                          .param_comp = 0};
      return kernels::adam_vector_head(k, gs, static_cast<unsigned>(state.moment_bytes()),
                                       copy != 0 ? ps : 0);
    };
    constexpr std::uint64_t kNone = ~std::uint64_t{0};
    if (head(0, state.params(t.subgroup), 0) == kNone) return true;  // one by one either way
    return std::none_of(
        state.spec(t.subgroup).slices.begin(), state.spec(t.subgroup).slices.end(),
        [&](const ParamSlice& p) { return head(p.offset, p.count, p.device_ptr) == kNone; });
  }
  // Counters set aside for subgroup s: one per chunk, or per slice where its kernel may write
  // the model.
  std::size_t counters_of(std::size_t s, bool resident) const {
    const std::size_t chunks = chunks_of(state.params(s), resident);
    return kernel_may_write_model(s, resident) ? std::max(chunks, state.spec(s).slices.size())
                                               : chunks;
  }
  std::deque<GpuTask> in_flight;  // enqueued through the copy-out, in copy-out order
  std::vector<GpuTask> committed;
  std::vector<GpuTask> failed;  // started, never committed: redone on the CPU
  Residency& residency = x.residency_;

  // Parameter writes: enqueued (confirmed at the join), and those that could not be enqueued.
  std::vector<std::size_t> written, unwritten;
};

std::uint64_t Executor::Phase::update_on_cpu(std::size_t s) const {
  kernels::CpuAdamOptions options{.threads = x.options_.cpu_threads};
  if (x.options_.cpu_isa) {
    options.force_isa = true;
    options.isa = *x.options_.cpu_isa;
  }
  kernels::AdamHyper h = hyper;
  h.rounding_seed = state.rounding_seed();
  return model.cpu_update(s, h, options);
}

void Executor::Phase::fault(const std::exception_ptr& error) {
  if (report.fault.empty()) report.fault = what_of(error);
  gpu_stopped = true;
}

// A wait or query failed: nothing on the device can be trusted to finish. Every subgroup in
// flight is redone on the CPU from its untouched state; what its queued work may still write
// (its spare slot, its buffer) is left alone.
void Executor::Phase::device_failed(const std::exception_ptr& error) {
  fault(error);
  device_usable = false;
  while (!in_flight.empty()) {
    const GpuTask t = in_flight.front();
    in_flight.pop_front();
    abandon(t, /*memory=*/false);
  }
  drop_waiting();
  // Their state never arrived: it stays on the device, lost with it (to_cpu reports them; those
  // planned on the GPU are rolled forward to the same end).
  homeward.clear();
  for (std::size_t s : std::exchange(awaiting_cpu, {})) to_cpu(s);
}

// A GPU subgroup that was started: its copy-in may still be reading its state. Wait for it; or,
// when the device cannot be waited for, move the state to a fresh slot first (the same bits), so
// that the CPU update never writes what a queued copy may still read; the old slot waits in
// quarantine. Not a resident subgroup whose pinned slot is not its state: the CPU never updates
// it (to_cpu reports it not updated), and a copy sending it home that could not be confirmed may
// still be writing that slot.
void Executor::Phase::settle_copy_in(const GpuTask& t) {
  bool settled = false;
  if (device_usable) {
    try {
      x.h2d_->synchronize();
      settled = true;
    } catch (...) {
      fault(std::current_exception());
      device_usable = false;
    }
  }
  if (!settled && residency.host_current(t.subgroup)) {
    const std::size_t s = t.subgroup;
    try {
      // (Weights outside the slot stay where they are: a queued copy that still reads them
      // feeds a GPU result that is never committed.)
      float* moved = state.take_spare(s);
      std::memcpy(moved, state.slot(s), state.slot_bytes(s));
      x.buffers_.quarantine_slot(s, state.commit(s, moved));
    } catch (...) {
      // No memory for it: updated where it is (only the stand-in still runs queued work).
    }
  }
}

void Executor::Phase::to_cpu(std::size_t s) {
  if (!residency.host_current(s)) {
    // Resident: its state must come back to its pinned slot first, or it cannot be updated.
    try {
      if (!device_usable) throw std::runtime_error("the device failed earlier in the phase");
      residency.to_host(s, *x.d2h_);
    } catch (...) {
      fault(std::current_exception());
      report.not_updated.push_back(s);
      return;
    }
  }
  if (residency.resident(s)) residency.host_written(s);  // the CPU updates the pinned slot
  if (const CUdeviceptr g = x.offload_->device_only_gradient(s); g != 0) {
    // Its gradient was kept on the GPU only: bring it over first. The kernel never writes it.
    try {
      driver::copy_to_host(state.grad(s), g, state.params(s) * gs);
    } catch (...) {
      fault(std::current_exception());
      report.not_updated.push_back(s);
      return;
    }
  }
  worker->add(s);
}

void Executor::Phase::fall_back(std::size_t s) {
  ++report.fallback_subgroups;
  to_cpu(s);
}

void Executor::Phase::roll_forward(std::size_t s) {
  ++report.rolled_forward;
  to_cpu(s);
}

void Executor::Phase::set_up_gpu() {
  // Bytes of one subgroup's buffer: state, the gradient unless kept on the GPU, and the staging
  // area of low-precision weights.
  auto bytes_of = [&](std::size_t s) {
    const std::uint64_t n = state.params(s);
    std::uint64_t b = state.slot_bytes(s) + wb * n;
    if (!gradients_on_gpu) b += n * gs;
    if (low) b += n * ps;
    return b;
  };
  for (std::size_t s : order) {
    buffer_bytes = std::max(buffer_bytes, bytes_of(s));
    largest = std::max(largest, state.params(s));
  }
  buffers_cap = std::max<std::size_t>(report.planned.buffers, 1);
  std::size_t chunks = 0;
  for (std::size_t s : order) {
    first_counter.push_back(chunks);
    chunks += counters_of(s, report.planned.subgroups[s].resident);
  }

  // Buffers kept from earlier phases are reused when large enough (runtime/buffer_pool.h).
  buffer = x.buffers_.take(buffer_bytes, buffers_cap);
  counters = x.buffers_.take_counters(8 * chunks);
  try {
    while (lanes.size() < buffer.size()) {
      lanes.emplace_back(x.spare_event(driver::Event::Timing::kDisabled));
    }
    if (counters.get() == 0) {
      counters = UpdateBuffer(x.buffers_.memory(), 8 * chunks, x.compute_->get());
    }
    host_counters = static_cast<std::uint64_t*>(state.arena().allocate(8 * chunks, 8));
    host_counter_count = chunks;
  } catch (...) {
    if (!out_of_memory(std::current_exception())) {
      fault(std::current_exception());
      return;  // run() sends the GPU subgroups to the CPU
    }
    allocation_failed = true;
    while (next < order.size()) fall_back(order[next++]);
  }
}

// A task for the next GPU subgroup on `lane`: where its gradient and new weights go, and its
// timing events.
Executor::GpuTask Executor::Phase::make_task(std::size_t lane) {
  GpuTask t;
  t.subgroup = order[next];
  t.counter = first_counter[next];
  t.buffer = lane;
  const CUdeviceptr base = buffer[lane].get();
  // Kept on the GPU: a prepared plan's (gradients_on_gpu), or a resident subgroup's.
  const CUdeviceptr kept = x.offload_->device_gradient(t.subgroup);
  t.grad_copied = kept == 0;
  if (gradients_on_gpu && t.grad_copied) {
    // The buffers have no room for it (prepare() routes every planned GPU subgroup's gradient).
    throw std::logic_error("tide: executor: a GPU subgroup's kept gradient is missing");
  }
  const std::uint64_t slot = state.slot_bytes_for(largest);
  t.grad = t.grad_copied ? base + grad_at() : kept;
  t.resident = report.planned.subgroups[t.subgroup].resident;
  t.chunk = chunk_params(state.params(t.subgroup), t.resident);
  t.chunks = chunks_of(state.params(t.subgroup), t.resident);
  // Only once its update is for good (resident, its pinned slot stale: updated_for_good): the
  // model must not see weights of an update that could still be redone elsewhere.
  t.writes_model = kernel_may_write_model(t.subgroup, t.resident) &&
                   residency.resident(t.subgroup) && !residency.host_current(t.subgroup) &&
                   keeps_vector_path(t);
  t.counters = t.writes_model ? state.spec(t.subgroup).slices.size() : t.chunks;
  t.state = base;  // a resident subgroup's device slot, once it has one (copy_in)
  if (wb != 0) {
    t.weights = base + params_at();  // staged to the host by the copy-out
  } else if (!low) {
    t.weights = base;  // the updated master weights themselves (fp32, or bf16 master)
  } else {
    t.weights = base + slot + (gradients_on_gpu ? 0 : largest * gs);
  }
  t.events = events.size();
  for (std::size_t k = 0; k < kStages + t.chunks * kChunkStages; ++k) {
    events.push_back(x.spare_event(driver::Event::Timing::kEnabled));
  }
  return t;
}

// The copy-in, once the lane's last copy-out is done (and, for fp32 weights, which are the state
// itself, once they were written out): chunk by chunk, the state's and the gradient's. The
// gradients are in pinned memory already (ready() waited for them).
void Executor::Phase::copy_in(GpuTask& t) {
  Lane& lane = lanes[t.buffer];
  const std::size_t s = t.subgroup;
  if (t.resident) {
    if (!residency.resident(s)) {
      // Joining. Throws std::bad_alloc before anything is enqueued: it falls back to the CPU.
      residency.attach(s,
                       UpdateBuffer(x.buffers_.memory(), state.slot_bytes(s), x.compute_->get()));
    }
    t.state = residency.device_slot(s);
    if (!low) t.weights = t.state;
  }
  // A resident subgroup's copy-in writes only its gradient into the lane, if any (its state goes
  // to its device slot).
  const bool writes_lane = !t.resident || t.grad_copied || wb != 0;
  if (lane.reusable && writes_lane) x.h2d_->wait(events[*lane.reusable]);
  if (!low && lane.written_recorded) x.h2d_->wait(lane.written);
  event(t, kH2dStart).record(*x.h2d_);
  // The bf16 weights are the model's parameters, bit for bit: copied on the device, and only the
  // compensation and the moments come over the link (2 bytes per parameter less).
  const bool weights_on_device = !t.resident && bf16_master && !x.stale_params_[s];
  if (weights_on_device) {
    for (const ParamSlice& slice : state.spec(s).slices) {
      driver::copy_on_device_async(t.state + 2 * slice.offset, slice.device_ptr, 2 * slice.count,
                                   *x.h2d_);
    }
  }
  // A resident subgroup's state comes in when it joins, or when its pinned slot was written since.
  const bool state_copied = !t.resident || !residency.device_current(s);
  t.state_copied = t.resident && state_copied;
  for (std::size_t c = 0; c < t.chunks; ++c) {
    const ModelParams::Range r = range(t, c);
    if (state_copied) copy_state_chunk(t, r, weights_on_device);
    model.copy_weights_in(s, buffer[t.buffer].get() + params_at(), r, *x.h2d_);
    if (t.grad_copied) model.copy_gradient_in(s, t.grad, r, *x.h2d_);
    chunk_event(t, c, kChunkIn).record(*x.h2d_);
  }
  event(t, kH2dEnd).record(*x.h2d_);
}

// One chunk of the state's slot (the whole slot, padding included, for a whole subgroup).
void Executor::Phase::copy_state_chunk(const GpuTask& t, ModelParams::Range r,
                                       bool weights_on_device) {
  const std::size_t s = t.subgroup;
  const auto* from = reinterpret_cast<const char*>(state.slot(s));
  if (r.count == state.params(s) && !weights_on_device) {
    driver::copy_to_device_async(t.state, from, state.slot_bytes(s), *x.h2d_);
    return;
  }
  const std::vector<SlotRange> ranges = state.slot_ranges(state.params(s), r.first, r.count);
  for (std::size_t k = weights_on_device ? 1 : 0; k < ranges.size(); ++k) {
    driver::copy_to_device_async(t.state + ranges[k].offset, from + ranges[k].offset,
                                 ranges[k].bytes, *x.h2d_);
  }
}

// The kernel's view of the elements [first, first + count) of t's subgroup: its gradient and
// state where the update finds them (the lane's, or its resident slot); no weight copy yet.
kernels::AdamGpuSubgroup Executor::Phase::adam_range(const GpuTask& t, std::uint64_t first,
                                                     std::uint64_t count) const {
  const std::uint64_t n = state.params(t.subgroup);
  const CUdeviceptr base = t.state;  // the state's layout from here (the lane's, or resident)
  kernels::AdamGpuSubgroup sub;
  sub.grad = t.grad + first * gs;
  const std::uint64_t mb = state.moment_bytes();
  if (bf16_master) {
    sub.param_bf16 = base + 2 * first;
    sub.param_comp = base + 2 * n + 2 * first;
  } else {
    sub.param = (wb != 0 ? buffer[t.buffer].get() + params_at() : base) + 4 * first;
  }
  // The host slot's layout (runtime/optimizer_state.h).
  sub.exp_avg = base + state.moment_offset(n, 0) + mb * first;
  sub.exp_avg_sq = base + state.moment_offset(n, 1) + mb * first;
  if (state.quantized()) {
    const std::uint64_t block = first / kernels::kQuantBlock;
    sub.exp_avg_scale = base + state.scale_offset(n, 0) + 4 * block;
    sub.exp_avg_sq_scale = base + state.scale_offset(n, 1) + 4 * block;
  }
  sub.count = count;
  sub.rounding_index = state.first_index(t.subgroup) + first;
  return sub;
}

void Executor::Phase::launch_adam(std::span<const kernels::AdamGpuSubgroup> subs,
                                  CUdeviceptr nonfinite) const {
  kernels::AdamGpuDtypes dtypes;
  dtypes.grad = state.options().grad_dtype;
  dtypes.state = state.options().state_dtype;
  dtypes.state_format = state.options().state_format;
  dtypes.copy = low ? std::optional(state.options().param_dtype) : std::nullopt;
  dtypes.master = state.options().master_dtype;
  dtypes.rounding = state.moment_rounding();
  kernels::AdamHyper h = hyper;
  h.rounding_seed = state.rounding_seed();
  x.adam_->step(subs, dtypes, h, nonfinite, *x.compute_);
}

// The update of chunk c, once its copy-in is done.
void Executor::Phase::update_chunk(const GpuTask& t, std::size_t c) {
  const ModelParams::Range r = range(t, c);
  x.compute_->wait(chunk_event(t, c, kChunkIn));
  chunk_event(t, c, kUpdateStart).record(*x.compute_);
  kernels::AdamGpuSubgroup sub = adam_range(t, r.first, r.count);
  sub.param_copy = low ? t.weights + ps * r.first : 0;
  launch_adam({&sub, 1}, counters.get() + 8 * (t.counter + c));
  chunk_event(t, c, kUpdateEnd).record(*x.compute_);
}

// A resident update whose kernel writes the new weights into the model (writes_model): one
// launch over the model's slices, one counter each, the weights straight to their parameters.
void Executor::Phase::update_into_model(const GpuTask& t) {
  x.compute_->wait(chunk_event(t, 0, kChunkIn));
  chunk_event(t, 0, kUpdateStart).record(*x.compute_);
  std::vector<kernels::AdamGpuSubgroup> subs;
  for (const ParamSlice& slice : state.spec(t.subgroup).slices) {
    subs.push_back(adam_range(t, slice.offset, slice.count));
    subs.back().param_copy = slice.device_ptr;
  }
  launch_adam(subs, counters.get() + 8 * t.counter);
  chunk_event(t, 0, kUpdateEnd).record(*x.compute_);
}

// The copy-out of chunk c into the spare slot (and staging area), once its update is done.
void Executor::Phase::copy_out_chunk(const GpuTask& t, std::size_t c) {
  const std::size_t s = t.subgroup;
  const ModelParams::Range r = range(t, c);
  x.d2h_->wait(chunk_event(t, c, kUpdateEnd));
  chunk_event(t, c, kOutStart).record(*x.d2h_);
  if (!t.resident) {
    auto* to = reinterpret_cast<char*>(t.slot);
    if (r.count == state.params(s)) {
      driver::copy_to_host_async(to, t.state, state.slot_bytes(s), *x.d2h_);
    } else {
      for (const SlotRange& b : state.slot_ranges(state.params(s), r.first, r.count)) {
        driver::copy_to_host_async(to + b.offset, t.state + b.offset, b.bytes, *x.d2h_);
      }
    }
  }
  if (t.staging != nullptr) {
    driver::copy_to_host_async(static_cast<char*>(t.staging) + wb * r.first,
                               buffer[t.buffer].get() + params_at() + wb * r.first, wb * r.count,
                               *x.d2h_);
  }
  chunk_event(t, c, kOutEnd).record(*x.d2h_);
}

// The update and the copy-out into a spare slot (taken here), chunk by chunk, and the counters;
// the callback wakes the coordinator to commit. Throws std::bad_alloc (or CudaError) for the
// spare before anything is enqueued.
void Executor::Phase::update_and_copy_out(GpuTask& t) {
  const std::size_t s = t.subgroup;
  Lane& lane = lanes[t.buffer];
  t.staging = model.take_staging(s);
  if (!t.resident) {
    try {
      t.slot = state.take_spare(s);
    } catch (...) {
      free_staging(t);
      t.staging = nullptr;
      throw;
    }
  }
  // The lane's weights area is rewritten by this kernel: after its last write to the model.
  if (low && lane.written_recorded && !t.writes_model) x.compute_->wait(lane.written);
  for (std::size_t c = 0; c < t.chunks; ++c) {
    if (t.writes_model) {
      update_into_model(t);
    } else {
      update_chunk(t, c);
    }
    t.kernel_enqueued = true;
    copy_out_chunk(t, c);
  }
  driver::copy_to_host_async(host_counters + t.counter, counters.get() + 8 * t.counter,
                             8 * t.counters, *x.d2h_);
  event(t, kD2hEnd).record(*x.d2h_);
  // A resident update copies nothing out of the lane (unless it stages weights): the next
  // copy-in need not wait for its counters, queued on the device-to-host stream behind other
  // lanes' copy-outs. (Its new weights wait in an area copy-ins do not write.)
  const bool copies_out_of_lane = !t.resident || t.staging != nullptr || wb != 0;
  lane.reusable =
      copies_out_of_lane ? t.events + kD2hEnd : chunk_event_at(t, t.chunks - 1, kUpdateEnd);
  x.d2h_->host_callback([w = wakeup] { w->notify(); });
  if (t.writes_model) {
    t.written_early = true;  // by the kernel: no copy, no lane held for it
    written.push_back(s);
  } else if (t.staging == nullptr && updated_for_good(t)) {
    write_early(t);
  }
}

// The write of a resident subgroup's new weights, enqueued behind its kernel: the next update
// on the lane, which reuses the area the weights wait in, waits for it on the device.
void Executor::Phase::write_early(GpuTask& t) {
  Lane& lane = lanes[t.buffer];
  t.written_early = true;
  try {
    x.params_->wait(chunk_event(t, t.chunks - 1, kUpdateEnd));
    if (model.write_committed(t.subgroup, t.weights, nullptr, *x.params_)) {
      lane.written.record(*x.params_);
      lane.written_recorded = true;
      written.push_back(t.subgroup);
    }
  } catch (...) {
    fault(std::current_exception());  // no more GPU work starts: the lane is not reused
    t.write_failed = true;
  }
}

void Executor::Phase::free_staging(const GpuTask& t) { model.give_staging(t.subgroup, t.staging); }

// Enqueues the rest of a subgroup whose state is being copied in, on a lane now free.
void Executor::Phase::finish(GpuTask t) {
  Lane& lane = lanes[t.buffer];
  try {
    update_and_copy_out(t);
    if (!t.written_early) lane.running = t;
    in_flight.push_back(t);
  } catch (...) {
    if (t.slot == nullptr && out_of_memory(std::current_exception())) {
      abandon(t, /*memory=*/true);  // no pinned memory for its result
    } else {
      fault(std::current_exception());
      abandon(t, /*memory=*/false);
    }
  }
}

// A started subgroup that will not complete on the GPU: updated on the CPU instead, from its
// untouched state.
void Executor::Phase::abandon(const GpuTask& t, bool memory) {
  if (updated_for_good(t)) {
    complete_in_place(t);  // its update is under way: it cannot be redone elsewhere
    return;
  }
  failed.push_back(t);
  settle_copy_in(t);
  if (memory) {
    fall_back(t.subgroup);
  } else {
    roll_forward(t.subgroup);
  }
}

// A resident subgroup whose update was enqueued in place, then something after it failed: the
// update completes there (its state is no longer the old one to redo it from). If the device
// cannot be waited for, its state is lost with the device.
void Executor::Phase::complete_in_place(const GpuTask& t) {
  try {
    if (!device_usable) throw std::runtime_error("the device failed during the phase");
    x.compute_->synchronize();
    driver::copy_to_host(host_counters + t.counter, counters.get() + 8 * t.counter, 8 * t.counters);
  } catch (...) {
    fault(std::current_exception());
    device_usable = false;
    failed.push_back(t);
    report.not_updated.push_back(t.subgroup);
    return;
  }
  commit(t);
}

void Executor::Phase::drop_waiting() {
  for (Lane& lane : lanes) {
    if (lane.next) {
      const GpuTask t = *lane.next;
      lane.next.reset();
      abandon(t, /*memory=*/false);
    }
  }
}

bool Executor::Phase::any_waiting() const {
  return std::any_of(lanes.begin(), lanes.end(), [](const Lane& l) { return l.next.has_value(); });
}

// Starts the next GPU subgroup: on a free lane, else on a new one, else, when the weights are
// not the state, copying its state and gradient in behind the subgroup that commits next (one
// at a time, so that the copy-in stream carries the subgroups in order; its update waits for the
// host to commit the lane's last subgroup). False when it must wait.
bool Executor::Phase::start_next() {
  const std::size_t s = order[next];
  std::optional<std::size_t> free, behind;
  for (std::size_t i = 0; i < lanes.size() && !free; ++i) {
    if (!lanes[i].running && !lanes[i].next) free = i;
  }
  if (!any_waiting()) {
    // The lane whose running subgroup commits first (one written early holds no lane).
    const auto r = std::find_if(in_flight.begin(), in_flight.end(),
                                [](const GpuTask& f) { return !f.written_early; });
    if (r != in_flight.end()) behind = r->buffer;
  }
  if (!free && buffer.size() < buffers_cap) {
    try {
      buffer.emplace_back(x.buffers_.memory(), buffer_bytes, x.compute_->get());
      lanes.emplace_back(x.spare_event(driver::Event::Timing::kDisabled));
      free = buffer.size() - 1;
    } catch (...) {
      if (buffer.size() > lanes.size()) buffer.pop_back();  // its event failed
      if (!out_of_memory(std::current_exception())) {
        fault(std::current_exception());
        return true;
      }
      // This subgroup goes to the CPU; later ones share the buffers there are.
      allocation_failed = true;
      buffers_cap = buffer.size();
      if (buffers_cap == 0) {
        while (next < order.size()) fall_back(order[next++]);
      } else {
        ++next;
        fall_back(s);
      }
      return true;
    }
  }
  if (!free && !(low && behind)) return false;
  GpuTask t;
  try {
    t = make_task(free ? *free : *behind);
  } catch (...) {
    fault(std::current_exception());
    return true;
  }
  ++next;
  try {
    copy_in(t);
    if (!free) {
      lanes[t.buffer].next = t;
      return true;
    }
    update_and_copy_out(t);
    if (!t.written_early) lanes[t.buffer].running = t;
    in_flight.push_back(t);
  } catch (...) {
    if (t.slot == nullptr && out_of_memory(std::current_exception())) {
      abandon(t, /*memory=*/true);
    } else {
      fault(std::current_exception());
      abandon(t, /*memory=*/false);
    }
  }
  return true;
}

// Commits the GPU subgroups whose copy-out completed, in order.
// True when it committed one: its lane may take the next subgroup.
bool Executor::Phase::poll() {
  bool any = false;
  while (!in_flight.empty()) {
    bool done = false;
    try {
      done = event(in_flight.front(), kD2hEnd).done();
    } catch (...) {
      device_failed(std::current_exception());
      return any;
    }
    if (!done) return any;
    const GpuTask t = in_flight.front();
    in_flight.pop_front();
    commit(t);
    any = true;
  }
  return any;
}

void Executor::Phase::commit(const GpuTask& t) {
  const std::size_t s = t.subgroup;
  Lane& lane = lanes[t.buffer];
  if (!t.written_early) lane.running.reset();  // else the lane was never held
  if (t.resident) {
    residency.updated_on_device(s);
  } else {
    state.give_spare(s, state.commit(s, t.slot));
  }
  for (std::size_t c = 0; c < t.counters; ++c) report.nonfinite += host_counters[t.counter + c];
  report.devices[s] = planner::Device::gpu;
  committed.push_back(t);
  if (t.written_early) {
    if (t.write_failed) unwritten.push_back(s);
    return;
  }
  // The weights reach the model from the committed state only.
  try {
    if (model.write_committed(s, t.weights, t.staging, *x.params_)) {
      lane.written.record(*x.params_);
      lane.written_recorded = true;
      written.push_back(s);
    }
  } catch (...) {
    fault(std::current_exception());
    unwritten.push_back(s);  // retried at the join
    free_staging(t);
    return;  // the lane's next subgroup is dropped: the GPU side is stopping
  }
  free_staging(t);
  if (lane.next && !gpu_stopped) {
    const GpuTask waiting = *lane.next;
    lane.next.reset();
    finish(waiting);
  }
}

void Executor::Phase::take_cpu_results() {
  for (CpuWorker::Done& d : worker->take()) {
    const std::size_t s = d.subgroup;
    if (!d.error.empty()) {
      if (report.fault.empty()) report.fault = "CPU update: " + d.error;
      report.not_updated.push_back(s);
      continue;
    }
    report.timings[s].cpu_update_s = d.seconds;
    report.cpu_spans[s] = {d.start, d.end};
    report.cpu_seconds += d.seconds;
    report.nonfinite += d.nonfinite;
    if (model.updated_in_place()) continue;
    if (!device_usable) {
      unwritten.push_back(s);
      continue;
    }
    try {
      model.upload(s, *x.upload_);
      written.push_back(s);
    } catch (...) {
      fault(std::current_exception());
      unwritten.push_back(s);
    }
  }
}

bool Executor::Phase::is_homeward(std::size_t s) const {
  return std::any_of(homeward.begin(), homeward.end(),
                     [s](const Homeward& h) { return h.subgroup == s; });
}

void Executor::Phase::take_arrivals() {
  for (auto h = homeward.begin(); h != homeward.end();) {
    bool done = false;
    try {
      done = h->arrived.done();
    } catch (...) {
      device_failed(std::current_exception());
      return;
    }
    if (!done) {
      ++h;
      continue;
    }
    const std::size_t s = h->subgroup;
    report.home_spans[s] = {h->sent, Clock::now()};
    residency.arrived(s);  // its slot's memory goes to the lanes (freed on the compute stream)
    h = homeward.erase(h);
    const auto cpu = std::find(awaiting_cpu.begin(), awaiting_cpu.end(), s);
    if (cpu != awaiting_cpu.end()) {
      awaiting_cpu.erase(cpu);
      to_cpu(s);
    }
  }
}

void Executor::Phase::run(const std::exception_ptr& no_context) {
  if (no_context) device_failed(no_context);
  order = report.planned.gpu_order;
  worker = std::make_unique<CpuWorker>([this](std::size_t s) { return update_on_cpu(s); }, wakeup);
  // Through to_cpu: a subgroup that was resident may have its gradient kept on the GPU. Those
  // whose state is on its way home go once it is there, after the others.
  for (std::size_t s : report.planned.cpu_order) {
    if (is_homeward(s)) {
      awaiting_cpu.push_back(s);
    } else {
      to_cpu(s);
    }
  }
  take_arrivals();
  if (!order.empty() && device_usable) set_up_gpu();

  bool closed = false;
  for (;;) {
    take_arrivals();
    // GPU work waits for the states sent home: their slots' memory is in the plan's headroom.
    while (!gpu_stopped && device_usable && homeward.empty() && next < order.size() &&
           start_next()) {
    }
    if (gpu_stopped || !device_usable) {
      while (next < order.size()) roll_forward(order[next++]);
      drop_waiting();
    }
    const bool committed_one = poll();
    take_cpu_results();
    if (!closed && next == order.size() && in_flight.empty() && !any_waiting() &&
        homeward.empty()) {
      worker->close();
      closed = true;
    }
    if (closed && worker->finished()) break;
    // A lane a commit freed takes the next subgroup now, not after the next wake-up: with one
    // lane (or weights that are the state, which never wait behind a lane) nothing else wakes
    // the coordinator until the poll interval.
    if (committed_one) continue;
    wakeup->wait(x.options_.poll_interval);
  }
  worker.reset();
  join();
}

// Waits for the phase's streams. When that fails, nothing it enqueued is known to be done: every
// parameter write is reported unwritten (the caller writes the same committed values), and what
// queued work may still write is quarantined.
void Executor::Phase::join() {
  bool confirmed = device_usable;
  if (confirmed) {
    try {
      for (auto* s : {x.h2d_, x.compute_, x.d2h_, x.params_, x.upload_}) {
        s->synchronize();
      }
    } catch (...) {
      fault(std::current_exception());
      confirmed = false;
    }
  }
  if (confirmed) {
    for (const GpuTask& t : committed) {
      planner::SubgroupTiming& timing = report.timings[t.subgroup];
      try {
        // The copy-in; the chunks' updates and copy-outs, without their waits for each other.
        timing.h2d_s = event(t, kH2dEnd).elapsed_ms(event(t, kH2dStart)) / 1e3;
        double update_ms = 0, out_ms = 0;
        for (std::size_t c = 0; c < t.chunks; ++c) {
          update_ms += chunk_event(t, c, kUpdateEnd).elapsed_ms(chunk_event(t, c, kUpdateStart));
          out_ms += chunk_event(t, c, kOutEnd).elapsed_ms(chunk_event(t, c, kOutStart));
        }
        timing.gpu_update_s = update_ms / 1e3;
        timing.d2h_s = out_ms / 1e3;
      } catch (...) {
        fault(std::current_exception());
      }
    }
    // Parameter writes that could not be enqueued: once more, synchronously.
    for (std::size_t s : unwritten) {
      try {
        x.write_params_locked(s);
      } catch (...) {
        fault(std::current_exception());
        report.unwritten.push_back(s);
      }
    }
  } else {
    report.unwritten = unwritten;
    report.unwritten.insert(report.unwritten.end(), written.begin(), written.end());
  }
  std::sort(report.unwritten.begin(), report.unwritten.end());
  report.unwritten.erase(std::unique(report.unwritten.begin(), report.unwritten.end()),
                         report.unwritten.end());
  std::sort(report.not_updated.begin(), report.not_updated.end());
  release(confirmed);
}

void Executor::Phase::release(bool confirmed) {
  // The GPU memory the phase held: what later plans are capped at if an allocation failed. The
  // gradients kept on the GPU count: they are part of what a plan places in the headroom.
  allocated_bytes = counters.size() + buffer.size() * buffer_bytes + x.buffers_.gradient_bytes();
  if (!confirmed) {
    // Stale device slots: queued work may still use them.
    for (std::size_t s = 0; s < state.size(); ++s) {
      if (residency.resident(s) && !residency.device_current(s)) {
        buffer.push_back(residency.take_slot(s));
      }
    }
    for (const GpuTask& t : failed) {
      if (t.slot != nullptr) x.buffers_.quarantine_slot(t.subgroup, t.slot);
      if (t.staging != nullptr) {
        x.buffers_.quarantine_pinned(t.staging, model.staging_bytes(t.subgroup));
      }
    }
    if (host_counters != nullptr)
      x.buffers_.quarantine_pinned(host_counters, 8 * host_counter_count);
    x.buffers_.quarantine(std::move(buffer), std::move(counters));
    try {
      x.offload_->route({});
    } catch (...) {
    }
    return;
  }
  for (const GpuTask& t : failed) {
    if (t.slot != nullptr) state.give_spare(t.subgroup, t.slot);
    free_staging(t);
  }
  for (std::size_t s = 0; s < state.size(); ++s) {
    if (residency.resident(s) && !residency.device_current(s)) residency.drop(s);  // stale
  }
  x.buffers_.release_quarantine(state);
  if (host_counters != nullptr) state.arena().deallocate(host_counters, 8 * host_counter_count);
  if (allocation_failed || !report.fault.empty()) {
    buffer.clear();  // memory is short, or the device failed: give everything back
    x.buffers_.clear();
  } else {
    x.buffers_.keep(std::move(buffer), std::move(counters), report.planned.headroom_bytes);
  }
  x.buffers_.clear_gradients();
  x.offload_->route({});
  if (report.fault.empty()) {
    // Every use of the events is over (the streams were waited for, their times read).
    for (driver::Event& e : events) x.spare_events_.push_back(std::move(e));
    for (Lane& lane : lanes) x.spare_lane_events_.push_back(std::move(lane.written));
  }
}

driver::Event Executor::spare_event(driver::Event::Timing timing) {
  std::vector<driver::Event>& spare =
      timing == driver::Event::Timing::kEnabled ? spare_events_ : spare_lane_events_;
  if (spare.empty()) return driver::Event(timing);
  driver::Event e = std::move(spare.back());
  spare.pop_back();
  return e;
}

const PhaseReport& Executor::run(const kernels::AdamHyper& hyper, const Policy& policy,
                                 std::uint64_t headroom_bytes) {
  // The phase's driver calls run on this (the caller's) thread, in the device's context, which
  // then becomes the caller's again. If it cannot be made current the phase runs on the CPU.
  std::optional<driver::ContextScope> scope;
  std::exception_ptr no_context;
  try {
    scope.emplace(context_);
  } catch (...) {
    no_context = std::current_exception();
  }
  const std::lock_guard lock(residency_mutex_);
  // Before anything changes: whatever fails here is rethrown, and nothing changed.
  (void)kernels::adam_coefficients(hyper);
  if (!ready_ || offload_->offloads() != ready_offloads_) ready(hyper);
  const bool prepared = prepared_.has_value();
  PhaseReport report;
  // The reclaimer cannot add to evicted_ during the phase (it only tries the lock held here);
  // reset once the phase has its report, so that a phase that throws loses none of it.
  report.pressure = evicted_;
  report.pressure.cache_releases = note_released_cache_locked();
  // Unprepared: the gradients were offloaded to host memory.
  const std::uint64_t held = options_.residency && !prepared ? residency_held(headroom_bytes) : 0;
  report.planned = prepared ? *prepared_ : plan_with(policy, headroom_bytes, false, held);
  for (planner::SubgroupPlan& sub : report.planned.subgroups) {
    // Frozen since the plan was prepared: its slices are saved from the pinned slot.
    const auto s = static_cast<std::size_t>(&sub - report.planned.subgroups.data());
    if (sub.resident && frozen_.any(s)) sub.resident = false;
  }
  if (prepared && buffers_.has_gradients()) {
    // The reclaimer gave back the kept gradients of some of the prepared plan's GPU subgroups
    // (a forward pass past the forecast): their gradients are in pinned memory, and the lanes
    // have no room for one. They are updated on the CPU (a resident one goes home first).
    std::vector<std::size_t> withdrawn;
    for (std::size_t s : report.planned.gpu_order) {
      if (offload_->device_gradient(s) == 0) withdrawn.push_back(s);
    }
    for (std::size_t s : withdrawn) {
      std::erase(report.planned.gpu_order, s);
      report.planned.cpu_order.push_back(s);
      report.planned.subgroups[s].device = planner::Device::cpu;
      report.planned.subgroups[s].resident = false;
    }
  }
  for (std::size_t s : report.planned.gpu_order) {
    if (offload_->device_gradient(s) != 0) ++report.kept_gradients;
  }
  report.timings.assign(state_.size(), planner::SubgroupTiming{});
  report.devices.assign(state_.size(), planner::Device::cpu);
  report.cpu_spans.assign(state_.size(), PhaseReport::Span{});
  report.home_spans.assign(state_.size(), PhaseReport::Span{});
  auto wakeup = std::make_shared<Wakeup>();
  std::vector<Homeward> sent_home = send_unplanned_home(report.planned, wakeup);
  std::optional<FrozenSlices::Saved> frozen;
  try {
    zero_frozen_kept_gradients();
    frozen.emplace(frozen_.save(state_));
  } catch (...) {
    // The step does not happen: what was sent home is waited for (no copy lands later), and
    // is home; a copy the device cannot finish leaves its state resident.
    for (Homeward& h : sent_home) {
      try {
        h.arrived.synchronize();
        residency_.arrived(h.subgroup);
      } catch (...) {
      }
    }
    throw;
  }
  ready_ = false;
  prepared_.reset();
  const bool gradients_on_gpu = prepared && buffers_.has_gradients();
  const planner::Footprint fp = footprint(gradients_on_gpu);

  // From here on the step completes (see executor.h): nothing below throws.
  const auto start = Clock::now();
  Phase phase(*this, hyper, report, gradients_on_gpu, std::move(wakeup), std::move(sent_home));
  phase.run(no_context);
  report.seconds = seconds_since(start);
  frozen_.restore(state_, *frozen);
  // Host-resident gradients are the caller's memory: none is read after this step.
  model_params_->forget_gradients();
  for (std::size_t s : phase.written) stale_params_[s] = 0;
  for (std::size_t s : report.unwritten) stale_params_[s] = 1;

  // What ran, under the model (the fallback subgroups among the CPU's): the copied-in subgroups
  // and the CPU's evaluated alone, after the resident updates (which copy no state out, and
  // none in unless it joined), so that each CPU subgroup is timed against the GPU side it ran
  // beside (planner/refine.h).
  std::vector<std::size_t> rest, ran;
  std::vector<planner::ResidentUpdate> resident_ran;
  std::vector<char> is_resident(state_.size(), 0);
  for (const GpuTask& t : phase.committed) {
    if (t.resident) {
      resident_ran.push_back({t.subgroup, t.state_copied, t.grad_copied});
      is_resident[t.subgroup] = 1;
    }
  }
  planner::Workload w;
  w.footprint = fp;
  w.headroom_bytes = std::numeric_limits<std::uint64_t>::max() / 2;
  std::vector<std::size_t> index_in_rest(state_.size(), 0);
  for (std::size_t s = 0; s < state_.size(); ++s) {
    if (is_resident[s] != 0) continue;
    index_in_rest[s] = rest.size();
    rest.push_back(s);
    w.subgroup_params.push_back(state_.params(s));
  }
  for (const GpuTask& t : phase.committed) {
    if (!t.resident) ran.push_back(index_in_rest[t.subgroup]);
  }
  const std::size_t buffers_used = phase.lanes.size();
  std::optional<planner::Plan> transient;
  if (!rest.empty()) {
    transient = ran.empty() ? planner::all_cpu_plan(w, refiner_.rates())
                            : evaluate(w, refiner_.rates(), planner::Placement{ran, buffers_used});
  }
  w.subgroup_params = state_.sizes();
  report.ran = planner::residents_first(w, refiner_.rates(), slot_sizes(),
                                        transient ? &*transient : nullptr, rest, resident_ran);
  if (resident_ran.empty() && transient) report.ran.buffers = transient->buffers;
  report.ran.headroom_bytes = report.planned.headroom_bytes;

  if (phase.allocation_failed) {
    headroom_cap_ = std::max<std::uint64_t>(phase.allocated_bytes, 1);
  } else if (headroom_cap_) {
    headroom_cap_ += headroom_cap_ / 4;
    if (headroom_cap_ >= headroom_bytes) headroom_cap_ = 0;
  }
  report.headroom_cap = headroom_cap_;
  if (options_.refine && report.fault.empty()) {
    refiner_.observe_phase(report.ran, fp, report.timings);
  }
  relax_pressure();
  offer_to_reclaim();
  // The phase's own allocations released the cache for its plan: only what comes after counts
  // as pressure from resident state (note_released_cache_locked), its kept gradients included.
  if (allocator::device::CachingAllocator* a = buffers_.caching_allocator()) {
    cache_releases_seen_ = a->usage().cache_releases;
  }
  if (options_.gradients_on_gpu != KeptGradients::yes) keep_resident_gradients();
  report.resident_subgroups = residency_.count();
  report.resident_bytes = residency_.bytes();
  for (const planner::SubgroupTiming& t : report.timings) {
    report.gpu_seconds += t.gpu_update_s;
    report.h2d_seconds += t.h2d_s;
    report.d2h_seconds += t.d2h_s;
  }
  evicted_ = PhaseReport::Pressure{};
  report_ = std::move(report);
  return report_;
}

}  // namespace tide::runtime
