#include "scheduler/executor.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <new>
#include <stdexcept>

#include "allocator/device_registry.h"
#include "allocator/pinned_arena.h"
#include "config/env.h"
#include "driver/error.h"
#include "driver/memory.h"
#include "kernels/adam_gpu.h"
#include "kernels/cpu_adam.h"
#include "scheduler/interleave.h"
#include "scheduler/rate_sources.h"

namespace tide::scheduler {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Memory pressure, as opposed to a broken device: only these make a subgroup fall back.
bool out_of_memory(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const driver::CudaError& e) {
    return e.result() == CUDA_ERROR_OUT_OF_MEMORY;
  } catch (const std::bad_alloc&) {
    return true;
  } catch (...) {
    return false;
  }
}

constexpr std::string_view kPolicyAccepts =
    "auto, cpu, gpu, or an integer K >= 1 (one GPU "
    "subgroup every K)";

// Timing events of one GPU subgroup: copy-in, update and copy-out, each start and end.
enum Stage { kH2dStart, kH2dEnd, kUpdateStart, kUpdateEnd, kD2hStart, kD2hEnd, kStages };

}  // namespace

Policy parse_policy(std::string_view text) {
  if (text == "auto") return Policy::automatic_policy();
  if (text == "cpu") return Policy::all_cpu();
  if (text == "gpu") return Policy::all_gpu();
  std::string_view digits = text;
  if (!digits.empty() && (digits[0] == 'k' || digits[0] == 'K')) digits.remove_prefix(1);
  std::size_t k = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), k);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() || k < 1 ||
      k > (std::size_t{1} << 30)) {
    throw std::invalid_argument("tide: placement policy \"" + std::string(text) +
                                "\" is not valid: it accepts " + std::string(kPolicyAccepts));
  }
  return Policy::every(k);
}

std::string policy_name(const Policy& policy) {
  switch (policy.kind) {
    case Policy::Kind::automatic:
      return "auto";
    case Policy::Kind::cpu:
      return "cpu";
    case Policy::Kind::gpu:
      return "gpu";
    case Policy::Kind::interleave:
      return "k" + std::to_string(policy.k);
  }
  return "?";
}

Policy policy_from_env(const Policy& fallback) {
  const std::optional<std::string> text = config::env_text("TIDE_PLACEMENT");
  if (!text) return fallback;
  try {
    return parse_policy(*text);
  } catch (const std::invalid_argument&) {
    throw config::EnvError("TIDE_PLACEMENT", *text, kPolicyAccepts);
  }
}

// One phase's GPU side: what was enqueued, and what fell back.
struct Executor::Pipeline {
  std::vector<std::size_t> order;  // planned GPU order
  std::size_t buffers = 0;         // planned
  bool gradients_on_gpu = false;

  std::vector<std::size_t> ran;       // GPU subgroups enqueued, in order
  std::vector<std::size_t> fallback;  // planned on the GPU, to update on the CPU
  std::size_t buffers_used = 0;
  bool allocation_failed = false;
  std::uint64_t allocated_bytes = 0;
  std::vector<UpdateBuffer> buffer;
  UpdateBuffer counters;                   // one nonfinite counter per enqueued subgroup
  std::uint64_t* host_counters = nullptr;  // pinned
  std::size_t host_counter_count = 0;
  std::vector<driver::Event> events;  // kStages per enqueued subgroup
};

Executor::Executor(OptimizerState& state, const ExecutorOptions& options)
    : state_(state),
      options_(options),
      context_(options.device),
      refiner_(options.rates ? *options.rates : resolve_rates(std::nullopt).rates,
               options.refine_options) {
  offload_ = std::make_unique<GradientOffload>(state_);
  adam_ = std::make_unique<kernels::AdamGpu>();
  h2d_ = std::make_unique<driver::Stream>();
  compute_ = std::make_unique<driver::Stream>();
  d2h_ = std::make_unique<driver::Stream>();
  upload_ = std::make_unique<driver::Stream>();
}

Executor::~Executor() {
  // Streams may still hold copies into the state (a phase that threw): let them finish before
  // the buffers they touch go away.
  try {
    context_.make_current();
    offload_->stream().synchronize();
    for (auto* s : {h2d_.get(), compute_.get(), d2h_.get(), upload_.get()}) s->synchronize();
  } catch (...) {
  }
}

void Executor::release_buffers() {
  context_.make_current();
  cached_.clear();
  cached_counters_ = UpdateBuffer();
}

allocator::DeviceMemoryResource& Executor::memory() {
  if (options_.memory != nullptr) return *options_.memory;
  if (headroom_memory_ == nullptr) {
    // Looked up at every allocation until found: PyTorch creates tide's allocator of a device
    // at its first allocation there, which may come after the optimizer.
    if (allocator::CachingAllocator* a = allocator::find_device_allocator(options_.device)) {
      headroom_memory_ = std::make_unique<allocator::HeadroomResource>(*a);
    }
  }
  if (headroom_memory_ != nullptr) return *headroom_memory_;
  return driver_memory_;
}

Footprint Executor::footprint(bool gradients_on_gpu) const {
  Footprint f;
  f.state_bytes_per_param = 12;
  f.gradient_bytes_per_param = state_.grad_bytes();
  f.weight_bytes_per_param = state_.param_bytes();  // what a CPU subgroup uploads
  f.gradients_on_gpu = gradients_on_gpu;
  return f;
}

std::uint64_t Executor::capped(std::uint64_t headroom) const {
  return headroom_cap_ ? std::min(headroom, headroom_cap_) : headroom;
}

Plan Executor::plan_for(const Policy& policy, std::uint64_t headroom_bytes) const {
  return plan_with(policy, headroom_bytes, options_.gradients_on_gpu);
}

Plan Executor::plan_with(const Policy& policy, std::uint64_t headroom_bytes,
                         bool gradients_on_gpu) const {
  Workload w;
  w.subgroup_params = state_.sizes();
  w.footprint = footprint(gradients_on_gpu);
  // Subgroups split over several parameter tensors need a staging area for the low-precision
  // weights in their buffer (the kernel writes them there, copies scatter them): leave room
  // for it by planning with proportionally less headroom.
  std::uint64_t headroom = capped(headroom_bytes);
  bool staging = false;
  for (std::size_t i = 0; i < state_.size(); ++i) staging |= !state_.contiguous(i);
  if (staging && state_.low_precision_params()) {
    const double per = static_cast<double>(w.footprint.h2d_bytes_per_param());
    headroom = static_cast<std::uint64_t>(static_cast<double>(headroom) * per /
                                          (per + state_.param_bytes()));
  }
  w.headroom_bytes = headroom;
  const Rates& r = refiner_.rates();
  std::optional<Plan> chosen;
  switch (policy.kind) {
    case Policy::Kind::cpu:
      break;
    case Policy::Kind::gpu: {
      std::vector<std::size_t> all(state_.size());
      for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
      chosen = plan_for_order(w, r, all, options_.planner);
      break;
    }
    case Policy::Kind::interleave:
      if (policy.k < 1) throw std::invalid_argument("tide: interleave policy needs K >= 1");
      chosen = plan_interleaved(w, r, policy.k, options_.planner);
      break;
    case Policy::Kind::automatic:
      chosen = plan(w, r, options_.planner);
      break;
  }
  return chosen ? *chosen : all_cpu_plan(w, r);
}

const Plan& Executor::prepare(const Policy& policy, std::uint64_t headroom_bytes) {
  context_.make_current();
  offload_->synchronize_all();  // no copy may be in flight to a buffer being re-routed
  resident_.clear();
  offload_->route({});
  prepared_ = plan_with(policy, headroom_bytes, options_.gradients_on_gpu);
  if (options_.gradients_on_gpu && !prepared_->gpu_order.empty()) {
    std::vector<CUdeviceptr> route(state_.size(), 0);
    try {
      for (std::size_t s : prepared_->gpu_order) {
        resident_.emplace_back(memory(), state_.params(s) * state_.grad_bytes(), compute_->get());
        route[s] = resident_.back().get();
      }
      offload_->route(std::move(route));
    } catch (...) {
      if (!out_of_memory(std::current_exception())) throw;
      // No room for the gradients on the GPU: they go to host memory, the plan is made again
      // without them, and later plans get less headroom.
      std::uint64_t got = 0;
      for (const auto& b : resident_) got += b.size();
      resident_.clear();
      headroom_cap_ = std::max<std::uint64_t>(got, 1);
      prepared_ = plan_with(policy, headroom_bytes, false);
    }
  }
  return *prepared_;
}

void Executor::run_gpu_side(Pipeline& p, const kernels::AdamHyper& hyper) {
  if (p.order.empty()) return;
  const bool low = state_.low_precision_params();
  const unsigned gs = state_.grad_bytes();
  const unsigned ps = state_.param_bytes();
  // Bytes of one subgroup's buffer: state, gradient when copied in, staging when scattered.
  auto bytes_of = [&](std::size_t s) {
    const std::uint64_t n = state_.params(s);
    std::uint64_t b = 12 * n;
    if (!p.gradients_on_gpu) b += n * gs;
    if (low && !state_.contiguous(s)) b += n * ps;
    return b;
  };
  std::uint64_t buffer_bytes = 0;
  for (std::size_t s : p.order) buffer_bytes = std::max(buffer_bytes, bytes_of(s));

  auto fall_back_from = [&](std::size_t j) {
    p.fallback.insert(p.fallback.end(), p.order.begin() + static_cast<std::ptrdiff_t>(j),
                      p.order.end());
  };
  // Buffers kept from earlier phases are reused when large enough: allocating and freeing
  // device memory every phase costs driver calls without tide's allocator (and cuMemFree
  // synchronises on a real GPU). Those this phase does not use stay kept (see run()'s release).
  for (auto it = cached_.begin(); it != cached_.end() && p.buffer.size() < p.buffers;) {
    if (it->size() >= buffer_bytes) {
      p.buffer.push_back(std::move(*it));
      it = cached_.erase(it);
    } else {
      ++it;
    }
  }
  if (cached_counters_.size() >= 8 * p.order.size()) p.counters = std::move(cached_counters_);
  cached_counters_ = UpdateBuffer();
  try {
    if (p.counters.get() == 0) {
      p.counters = UpdateBuffer(memory(), 8 * p.order.size(), compute_->get());
    }
    p.allocated_bytes += p.counters.size();
  } catch (...) {
    if (!out_of_memory(std::current_exception())) throw;
    p.allocation_failed = true;
    fall_back_from(0);
    return;
  }
  p.host_counter_count = p.order.size();
  p.host_counters =
      static_cast<std::uint64_t*>(state_.arena().allocate(8 * p.host_counter_count, 8));
  p.events.reserve(kStages * p.order.size());

  kernels::AdamGpuDtypes dtypes;
  dtypes.grad = state_.options().grad_dtype;
  dtypes.state = kernels::Dtype::kFloat32;
  dtypes.copy = low ? std::optional(state_.options().param_dtype) : std::nullopt;

  std::size_t buffers = p.buffers;
  for (std::size_t j = 0; j < p.order.size(); ++j) {
    const std::size_t s = p.order[j];
    if (p.buffer.size() < buffers) {
      try {
        p.buffer.emplace_back(memory(), buffer_bytes, compute_->get());
      } catch (...) {
        if (!out_of_memory(std::current_exception())) throw;
        // This subgroup goes to the CPU; later ones share the buffers there are.
        p.allocation_failed = true;
        buffers = p.buffer.size();
        if (buffers == 0) {
          fall_back_from(j);
          break;
        }
        p.fallback.push_back(s);
        continue;
      }
    }
    const std::size_t r = p.ran.size();  // position among the enqueued
    const std::size_t b = r % buffers;
    const std::uint64_t n = state_.params(s);
    const CUdeviceptr base = p.buffer[b].get();
    const CUdeviceptr grad_on_gpu = offload_->device_gradient(s);
    const CUdeviceptr grad = p.gradients_on_gpu && grad_on_gpu ? grad_on_gpu : base + 12 * n;
    for (int k = 0; k < kStages; ++k) p.events.emplace_back(driver::Event::Timing::kEnabled);
    driver::Event* ev = &p.events[kStages * r];

    // Copy-in: after the buffer's previous user has been copied out, and after this subgroup's
    // gradients have reached host memory.
    if (r >= buffers) h2d_->wait(p.events[kStages * (r - buffers) + kD2hEnd]);
    if (grad == base + 12 * n) offload_->wait_on(s, *h2d_);
    ev[kH2dStart].record(*h2d_);
    driver::copy_to_device_async(base, state_.param(s), 12 * n, *h2d_);
    if (grad == base + 12 * n) driver::copy_to_device_async(grad, state_.grad(s), n * gs, *h2d_);
    ev[kH2dEnd].record(*h2d_);

    // Update, then the weights reach the model's parameters.
    compute_->wait(ev[kH2dEnd]);
    if (grad != base + 12 * n) offload_->wait_on(s, *compute_);
    ev[kUpdateStart].record(*compute_);
    const SubgroupSpec& spec = state_.spec(s);
    const bool direct = state_.contiguous(s);
    const CUdeviceptr staging = base + 12 * n + (p.gradients_on_gpu ? 0 : n * gs);
    kernels::AdamGpuSubgroup sub;
    sub.grad = grad;
    sub.param = base;
    sub.exp_avg = base + 4 * n;
    sub.exp_avg_sq = base + 8 * n;
    sub.param_copy = low ? (direct ? spec.slices[0].device_ptr : staging) : 0;
    sub.count = n;
    adam_->step({&sub, 1}, dtypes, hyper, p.counters.get() + 8 * r, *compute_);
    if (!low || !direct) {
      const CUdeviceptr src = low ? staging : base;
      const unsigned size = low ? ps : 4;
      for (const ParamSlice& slice : spec.slices) {
        driver::copy_on_device_async(slice.device_ptr, src + slice.offset * size,
                                     slice.count * size, *compute_);
      }
    }
    ev[kUpdateEnd].record(*compute_);

    // Copy-out of the state; its end frees the buffer.
    d2h_->wait(ev[kUpdateEnd]);
    ev[kD2hStart].record(*d2h_);
    driver::copy_to_host_async(state_.param(s), base, 12 * n, *d2h_);
    ev[kD2hEnd].record(*d2h_);
    p.ran.push_back(s);
  }
  p.buffers_used = buffers;
  p.allocated_bytes += buffers * buffer_bytes;
  if (!p.ran.empty()) {
    // The counters of every kernel: the copy stream has waited for the last update already.
    driver::copy_to_host_async(p.host_counters, p.counters.get(), 8 * p.ran.size(), *d2h_);
  }
}

const PhaseReport& Executor::run(const kernels::AdamHyper& hyper, const Policy& policy,
                                 std::uint64_t headroom_bytes) {
  context_.make_current();
  (void)kernels::adam_coefficients(hyper);  // bad hyperparameters fail before anything runs
  const bool prepared = prepared_.has_value();
  Pipeline p;
  PhaseReport report;
  // Unprepared: the gradients were offloaded to host memory.
  report.planned = prepared ? *prepared_ : plan_with(policy, headroom_bytes, false);
  prepared_.reset();
  p.order = report.planned.gpu_order;
  p.buffers = report.planned.buffers;
  p.gradients_on_gpu = prepared && !resident_.empty();
  const Footprint fp = footprint(p.gradients_on_gpu);

  const auto start = Clock::now();
  std::exception_ptr error;
  try {
    run_gpu_side(p, hyper);
  } catch (...) {
    error = std::current_exception();
  }

  report.timings.assign(state_.size(), SubgroupTiming{});
  report.devices.assign(state_.size(), Device::cpu);
  std::vector<std::size_t> cpu_work = report.planned.cpu_order;
  cpu_work.insert(cpu_work.end(), p.fallback.begin(), p.fallback.end());
  const bool low = state_.low_precision_params();
  if (!error) {
    try {
      for (std::size_t s : cpu_work) {
        const std::uint64_t n = state_.params(s);
        offload_->synchronize(s);
        if (const CUdeviceptr g = offload_->device_gradient(s); g != 0 && p.gradients_on_gpu) {
          // A fallback subgroup whose gradient was kept on the GPU: bring it over first.
          driver::copy_to_host(state_.grad(s), g, n * state_.grad_bytes());
        }
        kernels::AdamSubgroup sub;
        sub.grad = state_.grad(s);
        sub.param = state_.param(s);
        sub.exp_avg = state_.exp_avg(s);
        sub.exp_avg_sq = state_.exp_avg_sq(s);
        sub.param_copy = state_.weight_copy(s);
        sub.count = n;
        sub.grad_dtype = state_.options().grad_dtype;
        sub.state_dtype = kernels::Dtype::kFloat32;
        sub.copy_dtype = low ? state_.options().param_dtype : kernels::Dtype::kBFloat16;
        const auto t0 = Clock::now();
        kernels::CpuAdamOptions cpu_options{.threads = options_.cpu_threads};
        if (options_.cpu_isa) {
          cpu_options.force_isa = true;
          cpu_options.isa = *options_.cpu_isa;
        }
        const kernels::AdamResult result = kernels::cpu_adam_step(sub, hyper, cpu_options);
        const double took = seconds_since(t0);
        report.timings[s].cpu_update_s = took;
        report.cpu_seconds += took;
        report.nonfinite += result.nonfinite;
        const char* src = low ? static_cast<const char*>(state_.weight_copy(s))
                              : reinterpret_cast<const char*>(state_.param(s));
        const unsigned size = state_.param_bytes();
        for (const ParamSlice& slice : state_.spec(s).slices) {
          driver::copy_to_device_async(slice.device_ptr, src + slice.offset * size,
                                       slice.count * size, *upload_);
        }
      }
    } catch (...) {
      error = std::current_exception();
    }
  }

  // Join: one event per stream, then the timings.
  driver::Event joined[3];
  joined[0].record(*compute_);
  joined[1].record(*d2h_);
  joined[2].record(*upload_);
  for (auto& e : joined) e.synchronize();
  h2d_->synchronize();  // already done (the copy-out waited on it); for a failed phase
  report.seconds = seconds_since(start);

  auto release = [&] {
    if (p.host_counters) state_.arena().deallocate(p.host_counters, 8 * p.host_counter_count);
    p.host_counters = nullptr;
    if (p.allocation_failed || error) {
      p.buffer.clear();  // memory is short: give everything back
      cached_.clear();
    } else {
      // Kept for the next phase: this phase's buffers, then earlier ones it did not use, as far
      // as they fit in this phase's headroom together (so that a plan that alternates between
      // fewer and more buffers does not allocate them again each time, and one that shrank with
      // the headroom holds no more than it).
      std::vector<UpdateBuffer> keep = std::move(p.buffer);
      std::uint64_t bytes = 0;
      for (const UpdateBuffer& b : keep) bytes += b.size();
      for (UpdateBuffer& b : cached_) {
        if (bytes + b.size() > report.planned.headroom_bytes) continue;  // freed below
        bytes += b.size();
        keep.push_back(std::move(b));
      }
      cached_ = std::move(keep);
      if (p.counters.get() != 0) cached_counters_ = std::move(p.counters);
    }
    resident_.clear();
    offload_->route({});
  };
  if (error) {
    release();
    std::rethrow_exception(error);
  }

  for (std::size_t r = 0; r < p.ran.size(); ++r) {
    const std::size_t s = p.ran[r];
    const driver::Event* ev = &p.events[kStages * r];
    SubgroupTiming& t = report.timings[s];
    t.h2d_s = ev[kH2dEnd].elapsed_ms(ev[kH2dStart]) / 1e3;
    t.gpu_update_s = ev[kUpdateEnd].elapsed_ms(ev[kUpdateStart]) / 1e3;
    t.d2h_s = ev[kD2hEnd].elapsed_ms(ev[kD2hStart]) / 1e3;
    report.devices[s] = Device::gpu;
    report.nonfinite += p.host_counters[r];
  }
  release();

  // What ran, under the model (the fallback subgroups among the CPU's).
  Workload w;
  w.subgroup_params = state_.sizes();
  w.footprint = fp;
  w.headroom_bytes = std::numeric_limits<std::uint64_t>::max() / 2;
  report.ran = p.ran.empty() ? all_cpu_plan(w, refiner_.rates())
                             : evaluate(w, refiner_.rates(), Placement{p.ran, p.buffers_used});
  report.ran.headroom_bytes = report.planned.headroom_bytes;
  report.fallback_subgroups = p.fallback.size();

  if (p.allocation_failed) {
    headroom_cap_ = std::max<std::uint64_t>(p.allocated_bytes, 1);
  } else if (headroom_cap_) {
    headroom_cap_ += headroom_cap_ / 4;
    if (headroom_cap_ >= headroom_bytes) headroom_cap_ = 0;
  }
  report.headroom_cap = headroom_cap_;
  if (options_.refine) refiner_.observe_phase(report.ran, fp, report.timings);
  report_ = std::move(report);
  return report_;
}

}  // namespace tide::scheduler
