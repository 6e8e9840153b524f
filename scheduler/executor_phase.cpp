// Executor::run: one update phase. executor.h describes the pipeline, the commit point and what
// happens on each kind of fault; this file is the coordinating thread's side of it.
#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "allocator/pinned_arena.h"
#include "driver/error.h"
#include "driver/memory.h"
#include "kernels/adam_gpu.h"
#include "kernels/cpu_adam.h"
#include "scheduler/cpu_worker.h"
#include "scheduler/executor.h"
#include "scheduler/memory_pressure.h"
#include "scheduler/wakeup.h"

namespace tide::scheduler {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Timing events of one GPU subgroup: copy-in, update and copy-out, each start and end.
enum Stage { kH2dStart, kH2dEnd, kUpdateStart, kUpdateEnd, kD2hStart, kD2hEnd, kStages };

// How long the coordinator sleeps when nothing wakes it: a lost device runs no callback, so it
// polls now and then to find out.
constexpr std::chrono::microseconds kPoll{20000};

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
  std::size_t position = 0;  // in the planned GPU order: its nonfinite counter
  std::size_t buffer = 0;
  std::size_t events = 0;   // its first timing event
  float* slot = nullptr;    // the spare its copy-out writes
  CUdeviceptr weights = 0;  // where the kernel leaves the new weights for the model
};

// One phase, from the coordinating (calling) thread.
struct Executor::Phase {
  Phase(Executor& executor, const kernels::AdamHyper& step_hyper, PhaseReport& phase_report,
        bool gradients_kept_on_gpu)
      : x(executor),
        state(executor.state_),
        hyper(step_hyper),
        report(phase_report),
        gradients_on_gpu(gradients_kept_on_gpu) {}

  void run();

  // The GPU side.
  void set_up_gpu();
  bool start_next();
  void enqueue(GpuTask& t);
  void poll();
  void commit(const GpuTask& t);
  // The CPU side.
  std::uint64_t update_on_cpu(std::size_t s) const;
  void to_cpu(std::size_t s);
  void fall_back(std::size_t s);
  void roll_forward(std::size_t s);
  void roll_forward(const GpuTask& t);
  void take_cpu_results();
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
  const bool low = state.low_precision_params();
  const unsigned gs = state.grad_bytes();
  const unsigned ps = state.param_bytes();

  std::shared_ptr<Wakeup> wakeup = std::make_shared<Wakeup>();
  std::unique_ptr<CpuWorker> worker;
  bool gpu_stopped = false;   // a fault: no more GPU work is started
  bool device_usable = true;  // false once a wait or query failed: no driver call but the join
  bool allocation_failed = false;
  std::uint64_t allocated_bytes = 0;  // GPU memory the phase held

  // GPU side.
  std::vector<std::size_t> order;  // planned
  std::size_t next = 0;            // the next of `order` to start
  std::size_t buffers_cap = 0;     // buffers it may have (fewer after a failed allocation)
  std::uint64_t buffer_bytes = 0;
  std::vector<UpdateBuffer> buffer;
  std::vector<driver::Event> buffer_free;  // recorded after the last parameter write from it
  std::vector<char> buffer_recorded, buffer_busy;
  UpdateBuffer counters;                   // one nonfinite counter per planned GPU subgroup
  std::uint64_t* host_counters = nullptr;  // pinned
  std::size_t host_counter_count = 0;
  std::deque<driver::Event> events;  // kStages per started subgroup (a deque: they never move)
  std::deque<GpuTask> in_flight;     // started, not yet committed, in copy-out order
  std::vector<GpuTask> committed;
  std::vector<GpuTask> failed;  // started, never committed: redone on the CPU

  // Parameter writes: enqueued (confirmed at the join), and those that could not be enqueued.
  std::vector<std::size_t> written, unwritten;
};

std::uint64_t Executor::Phase::update_on_cpu(std::size_t s) const {
  kernels::AdamSubgroup sub;
  sub.grad = state.grad(s);
  sub.param = state.param(s);
  sub.exp_avg = state.exp_avg(s);
  sub.exp_avg_sq = state.exp_avg_sq(s);
  sub.param_copy = state.weight_copy(s);
  sub.count = state.params(s);
  sub.grad_dtype = state.options().grad_dtype;
  sub.state_dtype = kernels::Dtype::kFloat32;
  sub.copy_dtype = low ? state.options().param_dtype : kernels::Dtype::kBFloat16;
  kernels::CpuAdamOptions options{.threads = x.options_.cpu_threads};
  if (x.options_.cpu_isa) {
    options.force_isa = true;
    options.isa = *x.options_.cpu_isa;
  }
  return kernels::cpu_adam_step(sub, hyper, options).nonfinite;
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
    failed.push_back(in_flight.front());
    in_flight.pop_front();
    roll_forward(failed.back());
  }
}

// A GPU subgroup that was started: its copy-in may still be reading its state. Wait for it; or,
// when the device cannot be waited for, move the state to a fresh slot first (the same bits), so
// that the CPU update never writes what a queued copy may still read; the old slot waits in
// quarantine.
void Executor::Phase::roll_forward(const GpuTask& t) {
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
  if (!settled) {
    const std::size_t s = t.subgroup;
    try {
      float* fresh = state.take_spare(s);
      std::copy(state.param(s), state.param(s) + 3 * state.params(s), fresh);
      x.quarantined_slots_.emplace_back(s, state.commit(s, fresh));
    } catch (...) {
      // No memory for it: updated where it is (only the stand-in still runs queued work).
    }
  }
  roll_forward(t.subgroup);
}

void Executor::Phase::to_cpu(std::size_t s) {
  if (const CUdeviceptr g = x.offload_->device_gradient(s); g != 0 && gradients_on_gpu) {
    // Its gradient was kept on the GPU: bring it over first. The kernel never writes it.
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
  // Bytes of one subgroup's buffer: state, the gradient unless kept on the GPU, and a staging
  // area for the low-precision weights unless they go over the gradient.
  const bool staging = x.needs_staging(gradients_on_gpu);
  auto bytes_of = [&](std::size_t s) {
    const std::uint64_t n = state.params(s);
    std::uint64_t b = 12 * n;
    if (!gradients_on_gpu) b += n * gs;
    if (staging) b += n * ps;
    return b;
  };
  for (std::size_t s : order) buffer_bytes = std::max(buffer_bytes, bytes_of(s));
  buffers_cap = std::max<std::size_t>(report.planned.buffers, 1);

  // Buffers kept from earlier phases are reused when large enough: allocating and freeing
  // device memory every phase costs driver calls without tide's allocator (and cuMemFree
  // synchronises on a real GPU). Those this phase does not use stay kept (see release()).
  for (auto it = x.cached_.begin(); it != x.cached_.end() && buffer.size() < buffers_cap;) {
    if (it->size() >= buffer_bytes) {
      buffer.push_back(std::move(*it));
      it = x.cached_.erase(it);
    } else {
      ++it;
    }
  }
  if (x.cached_counters_.size() >= 8 * order.size()) counters = std::move(x.cached_counters_);
  x.cached_counters_ = UpdateBuffer();
  try {
    for (std::size_t b = 0; b < buffer.size(); ++b) buffer_free.emplace_back();
    buffer_recorded.assign(buffer.size(), 0);
    buffer_busy.assign(buffer.size(), 0);
    if (counters.get() == 0) {
      counters = UpdateBuffer(x.memory(), 8 * order.size(), x.compute_->get());
    }
    host_counters = static_cast<std::uint64_t*>(state.arena().allocate(8 * order.size(), 8));
    host_counter_count = order.size();
  } catch (...) {
    if (!out_of_memory(std::current_exception())) {
      fault(std::current_exception());
      return;  // run() sends the GPU subgroups to the CPU
    }
    allocation_failed = true;
    while (next < order.size()) fall_back(order[next++]);
  }
}

// Starts the next GPU subgroup, or sends it to the CPU. False when it must wait for a buffer.
bool Executor::Phase::start_next() {
  const std::size_t s = order[next];
  std::optional<std::size_t> b;
  for (std::size_t i = 0; i < buffer.size() && !b; ++i) {
    if (!buffer_busy[i]) b = i;
  }
  if (!b) {
    if (buffer.size() >= buffers_cap) return false;
    try {
      buffer.emplace_back(x.memory(), buffer_bytes, x.compute_->get());
      buffer_free.emplace_back();
      buffer_recorded.push_back(0);
      buffer_busy.push_back(0);
      b = buffer.size() - 1;
    } catch (...) {
      if (buffer.size() > buffer_free.size()) buffer.pop_back();  // its event failed
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
  GpuTask t;
  t.subgroup = s;
  t.position = next;
  t.buffer = *b;
  try {
    t.slot = state.take_spare(s);
  } catch (...) {
    if (!out_of_memory(std::current_exception())) {
      fault(std::current_exception());
      return true;
    }
    ++next;
    fall_back(s);  // no pinned memory for its result
    return true;
  }
  ++next;
  buffer_busy[t.buffer] = 1;
  try {
    enqueue(t);
    in_flight.push_back(t);
  } catch (...) {
    fault(std::current_exception());
    failed.push_back(t);
    roll_forward(t);
  }
  return true;
}

void Executor::Phase::enqueue(GpuTask& t) {
  const std::size_t s = t.subgroup;
  const std::uint64_t n = state.params(s);
  const CUdeviceptr base = buffer[t.buffer].get();
  const CUdeviceptr kept = gradients_on_gpu ? x.offload_->device_gradient(s) : 0;
  const CUdeviceptr grad = kept != 0 ? kept : base + 12 * n;
  if (low) {
    t.weights = kept == 0 && gs == ps ? grad : base + 12 * n + (kept == 0 ? n * gs : 0);
  } else {
    t.weights = base;
  }
  t.events = events.size();
  for (int k = 0; k < kStages; ++k) events.emplace_back(driver::Event::Timing::kEnabled);
  driver::Event* ev = &events[t.events];

  // Copy-in, once the buffer's last parameter write has read it. The gradients are in pinned
  // memory already (ready() waited for them).
  if (buffer_recorded[t.buffer]) x.h2d_->wait(buffer_free[t.buffer]);
  ev[kH2dStart].record(*x.h2d_);
  driver::copy_to_device_async(base, state.param(s), 12 * n, *x.h2d_);
  if (kept == 0) driver::copy_to_device_async(grad, state.grad(s), n * gs, *x.h2d_);
  ev[kH2dEnd].record(*x.h2d_);

  // The update: the state in the buffer, the new weights next to it (over the gradient it read).
  x.compute_->wait(ev[kH2dEnd]);
  ev[kUpdateStart].record(*x.compute_);
  kernels::AdamGpuSubgroup sub;
  sub.grad = grad;
  sub.param = base;
  sub.exp_avg = base + 4 * n;
  sub.exp_avg_sq = base + 8 * n;
  sub.param_copy = low ? t.weights : 0;
  sub.count = n;
  kernels::AdamGpuDtypes dtypes;
  dtypes.grad = state.options().grad_dtype;
  dtypes.state = kernels::Dtype::kFloat32;
  dtypes.copy = low ? std::optional(state.options().param_dtype) : std::nullopt;
  x.adam_->step({&sub, 1}, dtypes, hyper, counters.get() + 8 * t.position, *x.compute_);
  ev[kUpdateEnd].record(*x.compute_);

  // Copy-out into the spare slot, and the counter; the callback wakes the coordinator to commit.
  x.d2h_->wait(ev[kUpdateEnd]);
  ev[kD2hStart].record(*x.d2h_);
  driver::copy_to_host_async(t.slot, base, 12 * n, *x.d2h_);
  driver::copy_to_host_async(host_counters + t.position, counters.get() + 8 * t.position, 8,
                             *x.d2h_);
  ev[kD2hEnd].record(*x.d2h_);
  x.d2h_->host_callback([w = wakeup] { w->notify(); });
}

// Commits the GPU subgroups whose copy-out completed, in order.
void Executor::Phase::poll() {
  while (!in_flight.empty()) {
    bool done = false;
    try {
      done = events[in_flight.front().events + kD2hEnd].done();
    } catch (...) {
      device_failed(std::current_exception());
      return;
    }
    if (!done) return;
    commit(in_flight.front());
    in_flight.pop_front();
  }
}

void Executor::Phase::commit(const GpuTask& t) {
  const std::size_t s = t.subgroup;
  state.give_spare(s, state.commit(s, t.slot));
  report.nonfinite += host_counters[t.position];
  report.devices[s] = Device::gpu;
  committed.push_back(t);
  // The weights reach the model from the committed state only.
  try {
    const unsigned size = low ? ps : 4;
    const std::vector<ParamSlice>& slices = state.spec(s).slices;
    for (std::size_t k = 0; k < slices.size(); ++k) {
      if (x.frozen_[s][k]) continue;
      driver::copy_on_device_async(slices[k].device_ptr, t.weights + slices[k].offset * size,
                                   slices[k].count * size, *x.params_);
    }
    buffer_free[t.buffer].record(*x.params_);
    buffer_recorded[t.buffer] = 1;
    buffer_busy[t.buffer] = 0;
    written.push_back(s);
  } catch (...) {
    fault(std::current_exception());
    unwritten.push_back(s);  // retried at the join
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
    report.cpu_seconds += d.seconds;
    report.nonfinite += d.nonfinite;
    if (!device_usable) {
      unwritten.push_back(s);
      continue;
    }
    try {
      x.upload_weights(s, *x.upload_);
      written.push_back(s);
    } catch (...) {
      fault(std::current_exception());
      unwritten.push_back(s);
    }
  }
}

void Executor::Phase::run() {
  try {
    x.context_.make_current();
  } catch (...) {
    device_failed(std::current_exception());
  }
  order = report.planned.gpu_order;
  worker = std::make_unique<CpuWorker>([this](std::size_t s) { return update_on_cpu(s); }, wakeup);
  for (std::size_t s : report.planned.cpu_order) worker->add(s);
  if (!order.empty() && device_usable) set_up_gpu();

  bool closed = false;
  for (;;) {
    while (!gpu_stopped && device_usable && next < order.size() && start_next()) {
    }
    if (gpu_stopped || !device_usable) {
      while (next < order.size()) roll_forward(order[next++]);
    }
    poll();
    take_cpu_results();
    if (!closed && next == order.size() && in_flight.empty()) {
      worker->close();
      closed = true;
    }
    if (closed && worker->finished()) break;
    wakeup->wait(kPoll);
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
      for (auto* s :
           {x.h2d_.get(), x.compute_.get(), x.d2h_.get(), x.params_.get(), x.upload_.get()}) {
        s->synchronize();
      }
    } catch (...) {
      fault(std::current_exception());
      confirmed = false;
    }
  }
  if (confirmed) {
    for (const GpuTask& t : committed) {
      const driver::Event* ev = &events[t.events];
      SubgroupTiming& timing = report.timings[t.subgroup];
      try {
        timing.h2d_s = ev[kH2dEnd].elapsed_ms(ev[kH2dStart]) / 1e3;
        timing.gpu_update_s = ev[kUpdateEnd].elapsed_ms(ev[kUpdateStart]) / 1e3;
        timing.d2h_s = ev[kD2hEnd].elapsed_ms(ev[kD2hStart]) / 1e3;
      } catch (...) {
        fault(std::current_exception());
      }
    }
    // Parameter writes that could not be enqueued: once more, synchronously.
    for (std::size_t s : unwritten) {
      try {
        x.write_params(s);
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
  allocated_bytes = counters.size() + buffer.size() * buffer_bytes;
  if (!confirmed) {
    x.unconfirmed_ = true;
    for (const GpuTask& t : failed) x.quarantined_slots_.emplace_back(t.subgroup, t.slot);
    for (auto* list : {&buffer, &x.cached_, &x.resident_}) {
      for (UpdateBuffer& b : *list) x.quarantined_.push_back(std::move(b));
      list->clear();
    }
    x.quarantined_.push_back(std::move(counters));
    if (host_counters != nullptr) {
      // Another phase's counters may be quarantined already (never: settle() ran before).
      x.quarantined_counters_ = host_counters;
      x.quarantined_counter_bytes_ = 8 * host_counter_count;
    }
    try {
      x.offload_->route({});
    } catch (...) {
    }
    return;
  }
  for (const GpuTask& t : failed) state.give_spare(t.subgroup, t.slot);
  for (const auto& [subgroup, slot] : x.quarantined_slots_) state.give_spare(subgroup, slot);
  x.quarantined_slots_.clear();
  if (host_counters != nullptr) state.arena().deallocate(host_counters, 8 * host_counter_count);
  if (allocation_failed || !report.fault.empty()) {
    buffer.clear();  // memory is short, or the device failed: give everything back
    x.cached_.clear();
  } else {
    // Kept for the next phase: this phase's buffers, then earlier ones it did not use, as far
    // as they fit in this phase's headroom together (so that a plan that alternates between
    // fewer and more buffers does not allocate them again each time, and one that shrank with
    // the headroom holds no more than it).
    std::vector<UpdateBuffer> keep = std::move(buffer);
    std::uint64_t bytes = 0;
    for (const UpdateBuffer& b : keep) bytes += b.size();
    for (UpdateBuffer& b : x.cached_) {
      if (bytes + b.size() > report.planned.headroom_bytes) continue;  // freed below
      bytes += b.size();
      keep.push_back(std::move(b));
    }
    x.cached_ = std::move(keep);
    if (counters.get() != 0) x.cached_counters_ = std::move(counters);
  }
  x.resident_.clear();
  x.offload_->route({});
}

const PhaseReport& Executor::run(const kernels::AdamHyper& hyper, const Policy& policy,
                                 std::uint64_t headroom_bytes) {
  // Before anything changes: whatever fails here is rethrown, and nothing changed.
  (void)kernels::adam_coefficients(hyper);
  if (!ready_ || offload_->offloads() != ready_offloads_) ready(hyper);
  const bool prepared = prepared_.has_value();
  PhaseReport report;
  // Unprepared: the gradients were offloaded to host memory.
  report.planned = prepared ? *prepared_ : plan_with(policy, headroom_bytes, false);
  report.timings.assign(state_.size(), SubgroupTiming{});
  report.devices.assign(state_.size(), Device::cpu);
  std::vector<float> frozen_state;
  save_frozen(frozen_state);
  ready_ = false;
  prepared_.reset();
  const bool gradients_on_gpu = prepared && !resident_.empty();
  const Footprint fp = footprint(gradients_on_gpu);

  // From here on the step completes (see executor.h): nothing below throws.
  const auto start = Clock::now();
  Phase phase(*this, hyper, report, gradients_on_gpu);
  phase.run();
  report.seconds = seconds_since(start);
  restore_frozen(frozen_state);

  // What ran, under the model (the fallback subgroups among the CPU's).
  Workload w;
  w.subgroup_params = state_.sizes();
  w.footprint = fp;
  w.headroom_bytes = std::numeric_limits<std::uint64_t>::max() / 2;
  std::vector<std::size_t> ran;
  for (const GpuTask& t : phase.committed) ran.push_back(t.subgroup);
  const std::size_t buffers_used = phase.buffer_free.size();
  report.ran = ran.empty() ? all_cpu_plan(w, refiner_.rates())
                           : evaluate(w, refiner_.rates(), Placement{ran, buffers_used});
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
  report_ = std::move(report);
  return report_;
}

}  // namespace tide::scheduler
