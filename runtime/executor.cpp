#include "runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "config/env.h"
#include "config/knobs.h"
#include "config/placement.h"
#include "driver/memory.h"
#include "driver/stream_pool.h"
#include "kernels/adam_gpu.h"
#include "kernels/cpu_adam.h"
#include "kernels/dtype.h"
#include "kernels/quant8.h"
#include "planner/cpu_only.h"
#include "planner/interleave.h"
#include "planner/node_rates.h"
#include "planner/rate_sources.h"
#include "planner/residency.h"
#include "runtime/device_params.h"
#include "runtime/host_params.h"
#include "runtime/memory_pressure.h"
#include "runtime/wakeup.h"

namespace tide::runtime {

Policy parse_policy(std::string_view text) {
  const std::optional<config::Placement> p = config::parse_placement(text);
  if (!p) {
    throw std::invalid_argument("tide: placement policy \"" + std::string(text) +
                                "\" is not valid: it accepts " +
                                std::string(config::kPlacementAccepts));
  }
  switch (p->kind) {
    case config::Placement::Kind::automatic:
      return Policy::automatic_policy();
    case config::Placement::Kind::cpu:
      return Policy::all_cpu();
    case config::Placement::Kind::gpu:
      return Policy::all_gpu();
    case config::Placement::Kind::interleave:
      break;
  }
  return Policy::every(p->k);
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
    case Policy::Kind::first:
      return "first" + std::to_string(policy.k);
  }
  return "?";
}

Policy policy_from_env(const Policy& fallback) {
  const std::optional<std::string> text = config::env_text("TIDE_PLACEMENT");
  if (!text) return fallback;
  try {
    return parse_policy(*text);
  } catch (const std::invalid_argument&) {
    throw config::EnvError("TIDE_PLACEMENT", *text, config::kPlacementAccepts);
  }
}

bool residency_from_env() {
  const std::optional<std::size_t> choice = config::env_choice("TIDE_RESIDENCY", {"auto", "off"});
  return !choice || *choice == 0;
}

std::uint64_t gpu_chunk_from_env() {
  const config::KnobValue v = config::read_knob("TIDE_GPU_CHUNK", std::nullopt);
  return v.set ? static_cast<std::uint64_t>(v.integer) : kDefaultGpuChunkParams;
}

namespace {

// `options` with the rates resolved when not given (built-in, calibration file, TIDE_RATE_*,
// shared out to the node's ranks), and the calibration's CPU update factors with them.
ExecutorOptions with_rates(ExecutorOptions options) {
  if (!options.rates) {
    const planner::ResolvedRates resolved = planner::resolve_node_rates();
    options.rates = resolved.rates;
    if (!options.cpu_update_factors) options.cpu_update_factors = resolved.cpu_update_factors();
  }
  return options;
}

}  // namespace

Executor::Executor(OptimizerState& state, const ExecutorOptions& options)
    : state_(state),
      options_(with_rates(options)),
      context_(options.device),
      refiner_(*options_.rates, options_.refine_options),
      buffers_(options_.device, options_.memory),
      residency_(state_),
      frozen_(state_) {
  if (options_.gpu_chunk_params == 0 || options_.gpu_chunk_params % kernels::kQuantBlock != 0) {
    throw std::invalid_argument("tide: executor: gpu_chunk_params must be a positive multiple of " +
                                std::to_string(kernels::kQuantBlock) + ", not " +
                                std::to_string(options_.gpu_chunk_params));
  }
  if (state_.host_params() && options_.gradients_on_gpu == KeptGradients::yes) {
    throw std::invalid_argument(
        "tide: executor: host-resident parameters read their gradients where they are: "
        "gradients_on_gpu does not apply");
  }
  const driver::ContextScope scope(context_);
  driver::StreamPool& streams = driver::StreamPool::of(context_);
  offload_ = std::make_unique<GradientOffload>(state_, streams.next());
  adam_ = std::make_unique<kernels::AdamGpu>();
  for (auto* s : {&h2d_, &compute_, &d2h_, &params_, &upload_}) *s = &streams.next();
  stale_params_.assign(state_.size(), 1);
  // Cache releases count from now (the allocator's count is the process's).
  if (allocator::device::CachingAllocator* a = buffers_.caching_allocator()) {
    cache_releases_seen_ = a->usage().cache_releases;
  }
  if (state_.host_params()) {
    model_params_ = std::make_unique<HostParams>(state_, frozen_);
  } else {
    model_params_ = std::make_unique<DeviceParams>(state_, frozen_, context_, options_.cpu_threads);
  }
}

Executor::~Executor() {
  // Streams may still hold work on the state and the buffers (a phase that could not wait for
  // it): wait for it before they go, or, if the device cannot be waited for, leak them all. The
  // buffers go here, while the device's context is current (streams and events see to their own).
  try {
    if (reclaimed_from_ != nullptr) reclaimed_from_->remove_reclaimer(reclaimer_);
    const driver::ContextScope scope(context_);
    settle();
    synchronize_streams();
    (void)evict();  // the state outlives the executor: it goes back to its pinned slots
    buffers_.clear_gradients();
    buffers_.clear();
  } catch (...) {
    buffers_.leak();
    residency_.leak();
    state_.abandon();
  }
}

void Executor::settle() {
  if (!buffers_.unconfirmed()) return;
  synchronize_streams();
  buffers_.release_quarantine(state_);
}

void Executor::synchronize_streams() const {
  offload_->stream().synchronize();
  for (const driver::Stream* s : {h2d_, compute_, d2h_, params_, upload_}) s->synchronize();
}

void Executor::ready(const kernels::AdamHyper& hyper) {
  (void)kernels::adam_coefficients(hyper);  // bad hyperparameters fail before anything runs
  ready_ = false;
  const driver::ContextScope scope(context_);
  settle();
  offload_->synchronize_all();
  model_params_->check_gradients();
  ready_offloads_ = offload_->offloads();
  ready_ = true;
}

void Executor::set_host_gradient(std::size_t subgroup, std::size_t slice, const void* grad) {
  model_params_->set_gradient(subgroup, slice, grad);
  ready_ = false;  // ready() checks them again
}

const void* Executor::host_gradient(std::size_t subgroup, std::size_t slice) const {
  return model_params_->gradient(subgroup, slice);
}

GradientStats Executor::gradient_stats() const { return model_params_->gradient_stats(*offload_); }

void Executor::release_buffers() {
  const std::lock_guard lock(residency_mutex_);
  const driver::ContextScope scope(context_);
  settle();
  buffers_.clear();
  hand_freed_blocks_over();
}

void Executor::hand_freed_blocks_over() {
  allocator::device::CachingAllocator* a = buffers_.caching_allocator();
  if (a == nullptr) return;
  const std::uint64_t frees = a->frees_so_far();
  try {
    synchronize_streams();
  } catch (...) {
    return;  // they wait for the allocator's events, as any block freed on a stream
  }
  // Every buffer and slot of the executor is allocated on the compute stream.
  a->streams_waited(compute_->get(), frees);
}

void Executor::write_params(std::size_t s) {
  const std::lock_guard lock(residency_mutex_);
  write_params_locked(s);
}

void Executor::write_params_locked(std::size_t s) {
  if (!residency_.host_current(s)) {
    // The parameters are written from the pinned slot: it must hold the state first.
    const driver::ContextScope scope(context_);
    settle();
    synchronize_streams();
    residency_.to_host(s, *d2h_);
  }
  if (model_params_->writes_without_device(s)) {
    // Host memory: written now, whatever the device. Work a failed phase left queued writes
    // these parameters with the same committed values only, and the next step settles it first.
    model_params_->write(s);
  } else {
    const driver::ContextScope scope(context_);
    settle();  // no queued write of an earlier phase may land after this one
    model_params_->write(s);
  }
  stale_params_[s] = 0;
}

planner::Footprint Executor::footprint(bool gradients_on_gpu) const {
  planner::Footprint f;
  f.state_bytes_per_param = state_.state_bytes();
  f.quantized_moments = state_.quantized();
  f.gradient_bytes_per_param = state_.grad_bytes();
  // What a CPU subgroup uploads (nothing when the parameters are updated where they are).
  f.weight_bytes_per_param = model_params_->updated_in_place() ? 0 : state_.param_bytes();
  if (state_.bf16_master()) {
    f.weights_in_state = true;
    f.state_bytes_on_gpu = state_.param_bytes();  // GPU subgroups take them from the model
  }
  f.gradients_on_gpu = gradients_on_gpu;
  f.staging_bytes_per_param = needs_staging() ? state_.param_bytes() : 0;
  if (options_.cpu_update_factors) f.calibrate_cpu(*options_.cpu_update_factors);
  return f;
}

std::uint64_t Executor::capped(std::uint64_t headroom) const {
  return headroom_cap_ ? std::min(headroom, headroom_cap_) : headroom;
}

// The kernel writes low-precision weights into an area of the buffer of their own, which the
// model's parameters are written from once the subgroup is committed. Never over the gradient it
// read: a lane's next subgroup then copies its gradient in with its state, chunk by chunk, while
// the last one's weights still wait to be written out, and its first chunk's update waits for no
// more than that chunk.
bool Executor::needs_staging() const { return state_.separate_weights(); }

planner::Plan Executor::plan_for(const Policy& policy, std::uint64_t headroom_bytes) const {
  return plan_with(policy, headroom_bytes, options_.gradients_on_gpu == KeptGradients::yes);
}

void Executor::sync_state(bool written) {
  const std::lock_guard lock(residency_mutex_);
  if (residency_.count() == 0) return;
  const driver::ContextScope scope(context_);
  settle();
  synchronize_streams();  // no queued write of the state may land after the copy
  for (std::size_t s = 0; s < state_.size(); ++s) {
    if (!residency_.resident(s)) continue;
    residency_.to_host(s, *d2h_);
    if (written) residency_.host_written(s);
  }
}

std::uint64_t Executor::evict(std::uint64_t max_bytes) {
  const std::lock_guard lock(residency_mutex_);
  return evict_locked(max_bytes);
}

void Executor::offer_to_reclaim() {
  if (reclaimed_from_ != nullptr || (residency_.count() == 0 && !buffers_.has_gradients())) {
    return;
  }
  allocator::device::CachingAllocator* a = buffers_.caching_allocator();
  if (a == nullptr) return;
  reclaimer_ = a->add_reclaimer([this](std::uint64_t bytes) -> std::uint64_t {
    const std::unique_lock lock(residency_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return 0;
    // Kept gradients that hold nothing yet cost nothing to give back; resident state costs a
    // copy home and a copy in later. One kind per call: the allocator tries again in between.
    if (const std::uint64_t withdrawn = withdraw_kept_gradients_locked(bytes); withdrawn > 0) {
      return withdrawn;
    }
    const auto start = std::chrono::steady_clock::now();
    const std::size_t before = residency_.count();
    const std::uint64_t freed = evict_locked(bytes);
    if (freed > 0) note_pressure_locked();
    evicted_.evicted_subgroups += before - residency_.count();
    evicted_.evicted_bytes += freed;
    evicted_.evict_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return freed;
  });
  reclaimed_from_ = a;
}

std::uint64_t Executor::withdraw_kept_gradients_locked(std::uint64_t max_bytes) {
  // A prepared plan's (gradients_on_gpu): held from zero_grad() on. Resident subgroups' kept
  // gradients (keep_resident_gradients) go with their state when it is evicted.
  if (!prepared_ || !buffers_.has_gradients()) return 0;
  std::uint64_t freed = 0;
  for (const GradientOffload::Withdrawn& w : offload_->withdraw_unwritten(max_bytes)) {
    // No gradient reached it: nothing queued writes it, and its subgroup's go to pinned memory.
    const std::uint64_t bytes = buffers_.free_gradient(w.buffer);
    freed += bytes;
    evicted_.withdrawn_gradients += bytes > 0 ? 1 : 0;
  }
  evicted_.withdrawn_bytes += freed;
  if (freed > 0) {
    const driver::ContextScope scope(context_);
    hand_freed_blocks_over();  // allocated on the compute stream; the allocation is on another
  }
  return freed;
}

std::uint64_t Executor::evict_locked(std::uint64_t max_bytes) {
  if (residency_.bytes() == 0) return 0;
  const driver::ContextScope scope(context_);
  settle();
  synchronize_streams();
  const std::uint64_t before = residency_.bytes();
  // The last subgroups first, as the plan lets them go when memory shrinks.
  for (std::size_t s = state_.size(); s-- > 0 && before - residency_.bytes() < max_bytes;) {
    if (!residency_.resident(s)) continue;
    residency_.to_host(s, *d2h_);
    residency_.drop(s);
  }
  hand_freed_blocks_over();
  return before - residency_.bytes();
}

std::uint64_t Executor::resident_cost(std::size_t s) const {
  // A resident subgroup holds its gradient's buffer too (kept on the GPU by prepare() with
  // gradients_on_gpu, else by keep_resident_gradients()).
  return state_.slot_bytes(s) + state_.params(s) * state_.grad_bytes();
}

void Executor::note_pressure_locked(std::uint64_t give_back) {
  std::uint64_t stayed = resident_working_bytes();
  for (std::size_t s = 0; s < state_.size(); ++s) {
    if (residency_.resident(s)) stayed += resident_cost(s);
  }
  stayed -= std::min(stayed, give_back);
  pressure_budget_ = pressure_budget_ ? std::min(*pressure_budget_, stayed) : stayed;
  if (relaxed_) quiet_needed_ = std::min(2 * quiet_needed_, kMaxQuietPhases);
  relaxed_ = false;
  reclaimed_ = true;
}

std::uint64_t Executor::note_released_cache_locked() {
  allocator::device::CachingAllocator* a = buffers_.caching_allocator();
  if (a == nullptr) return 0;
  const std::uint64_t releases = a->usage().cache_releases;
  const std::uint64_t since =
      releases - std::min(releases, cache_releases_seen_.value_or(releases));
  cache_releases_seen_ = releases;
  // A reclaim since the last phase has already capped the budget for the same pressure.
  if (since == 0 || reclaimed_ || residency_.count() == 0) return since;
  std::uint64_t resident = 0, largest = 0;
  for (std::size_t s = 0; s < state_.size(); ++s) {
    if (!residency_.resident(s)) continue;
    resident += resident_cost(s);
    largest = std::max(largest, resident_cost(s));
  }
  note_pressure_locked(std::max(resident / 4, largest));
  return since;
}

void Executor::relax_pressure() {
  quiet_phases_ = reclaimed_ ? 0 : quiet_phases_ + 1;
  reclaimed_ = false;
  if (!pressure_budget_ || quiet_phases_ < quiet_needed_) return;
  std::uint64_t largest = 0, all = resident_working_bytes();
  for (std::size_t s = 0; s < state_.size(); ++s) {
    largest = std::max(largest, resident_cost(s));
    all += resident_cost(s);
  }
  *pressure_budget_ += std::max(*pressure_budget_ / 4, largest);
  relaxed_ = true;
  // Past every subgroup's cost (with the hysteresis band) it cannot bind any more.
  if (static_cast<double>(*pressure_budget_) * (1.0 - options_.residency_hysteresis) >=
      static_cast<double>(all)) {
    pressure_budget_.reset();
  }
}

std::uint64_t Executor::resident_working_bytes() const {
  std::uint64_t largest = 0;
  for (std::size_t s = 0; s < state_.size(); ++s) largest = std::max(largest, state_.params(s));
  return lane_bytes_for(largest);
}

std::uint64_t Executor::lane_bytes_for(std::uint64_t params) const {
  // While one is updated: its lane (state area, gradient, weights).
  return state_.slot_bytes_for(params) + params * (state_.grad_bytes() + state_.param_bytes());
}

std::vector<char> Executor::choose_resident(const Policy& policy, std::uint64_t held_bytes) const {
  std::vector<char> none(state_.size(), 0);
  if (!options_.residency || policy.kind != Policy::Kind::automatic || state_.host_params() ||
      held_bytes == 0) {
    return none;
  }
  planner::ResidencyInput in;
  in.held_bytes = pressure_budget_ ? std::min(held_bytes, *pressure_budget_) : held_bytes;
  in.working_bytes = resident_working_bytes();
  in.hysteresis = options_.residency_hysteresis;
  in.resident = residency_.flags();
  in.allowed.assign(state_.size(), 1);
  in.slot_bytes.resize(state_.size());
  for (std::size_t s = 0; s < state_.size(); ++s) {
    in.slot_bytes[s] = resident_cost(s);
    // Frozen slices are saved from and restored into the pinned slot around the phase;
    // pageable subgroups are updated on the CPU only.
    if (frozen_.any(s) || state_.pageable(s)) in.allowed[s] = 0;
  }
  return planner::choose_resident(in);
}

planner::ResidentPlan Executor::plan_around_resident(const planner::Workload& w,
                                                     const std::vector<char>& resident) const {
  std::vector<planner::ResidentUpdate> residents;
  std::uint64_t largest = 0;
  for (std::size_t s = 0; s < state_.size(); ++s) {
    if (resident[s] == 0) continue;
    // Its gradient comes over the link unless it was kept on the GPU (a prepared plan's, or a
    // resident subgroup's since the last phase: keep_resident_gradients).
    const bool grad_kept = w.footprint.gradients_on_gpu || offload_->device_gradient(s) != 0;
    residents.push_back({s, !residency_.device_current(s), !grad_kept});
    largest = std::max(largest, state_.params(s));
  }
  planner::ResidentLayout layout;
  layout.slot_bytes = slot_sizes();
  layout.lane_bytes = lane_bytes_for(largest);
  layout.gpu_allowed = gpu_allowed();
  return planner::plan_around_resident(w, refiner_.rates(), layout, std::move(residents),
                                       options_.planner);
}

std::vector<std::uint64_t> Executor::slot_sizes() const {
  std::vector<std::uint64_t> bytes(state_.size());
  for (std::size_t s = 0; s < state_.size(); ++s) bytes[s] = state_.slot_bytes(s);
  return bytes;
}

std::uint64_t Executor::residency_held(std::uint64_t headroom_bytes) {
  try {
    return buffers_.residency_budget(headroom_bytes);
  } catch (...) {
    return 0;  // the phase then keeps what is resident where it is (end_unplanned_residency)
  }
}

void Executor::keep_resident_gradients() {
  if (!options_.residency || residency_.count() == 0) return;
  std::vector<CUdeviceptr> route(state_.size(), 0);
  try {
    offload_->synchronize_all();
    for (std::size_t s = 0; s < state_.size(); ++s) {
      if (!residency_.device_current(s)) continue;
      route[s] = buffers_.add_gradient(state_.params(s) * state_.grad_bytes(), compute_->get());
    }
    offload_->route(std::move(route));
  } catch (...) {
    // No memory (or no device): the gradients go to pinned memory, as for any subgroup.
    buffers_.clear_gradients();
    try {
      offload_->route({});
    } catch (...) {
    }
  }
}

void Executor::zero_frozen_kept_gradients() {
  try {
    bool any = false;
    for (std::size_t s = 0; s < state_.size(); ++s) {
      const CUdeviceptr g = offload_->device_gradient(s);
      if (g == 0 || !frozen_.any(s)) continue;
      const std::vector<ParamSlice>& slices = state_.spec(s).slices;
      for (std::size_t k = 0; k < slices.size(); ++k) {
        if (!frozen_.frozen(s, k)) continue;
        driver::fill_zero_async(g + slices[k].offset * state_.grad_bytes(),
                                slices[k].count * state_.grad_bytes(), offload_->stream());
        any = true;
      }
    }
    if (any) offload_->stream().synchronize();
  } catch (...) {
    // A failed device: the phase finds it too, and those gradients are lost with it.
  }
}

std::vector<Executor::Homeward> Executor::send_unplanned_home(
    planner::Plan& plan, const std::shared_ptr<Wakeup>& wakeup) {
  std::vector<std::size_t> leaving;
  for (std::size_t s = 0; s < state_.size(); ++s) {
    if (residency_.resident(s) && !plan.subgroups[s].resident) leaving.push_back(s);
  }
  std::vector<Homeward> sent;
  if (leaving.empty()) return sent;
  std::vector<std::size_t> stuck;  // could not be sent home: they stay resident this phase
  try {
    settle();
    synchronize_streams();
    for (std::size_t s : leaving) {
      Homeward h{
          .subgroup = s, .arrived = driver::Event(), .sent = std::chrono::steady_clock::now()};
      try {
        if (!residency_.send_home(s, *d2h_)) {
          residency_.drop(s);  // its pinned slot is current already (a synced mirror)
          continue;
        }
        h.arrived.record(*d2h_);
        d2h_->host_callback([w = wakeup] { w->notify(); });
        sent.push_back(std::move(h));
      } catch (...) {
        stuck.push_back(s);  // a copy may be under way: the join waits for it
      }
    }
    // Frozen slices are saved from the pinned slot before the phase: theirs must be there.
    for (auto h = sent.begin(); h != sent.end();) {
      if (!frozen_.any(h->subgroup)) {
        ++h;
        continue;
      }
      h->arrived.synchronize();
      residency_.arrived(h->subgroup);
      h = sent.erase(h);
    }
  } catch (...) {
    // The device failed: whatever was sent is seen by the phase (as lost), the rest stays.
    for (std::size_t s : leaving) {
      const bool is_sent =
          std::any_of(sent.begin(), sent.end(), [s](const Homeward& h) { return h.subgroup == s; });
      if (!is_sent && residency_.resident(s) &&
          std::find(stuck.begin(), stuck.end(), s) == stuck.end()) {
        stuck.push_back(s);
      }
    }
  }
  if (stuck.empty()) return sent;
  // Their state is on the device only: it is updated there (if the device still can), never
  // from the stale pinned slot. Another bucket of the same step may already have been updated,
  // so this does not throw: a device that is lost loses them (not_updated).
  auto drop_from = [&](std::vector<std::size_t>& order, std::size_t s) {
    order.erase(std::remove(order.begin(), order.end(), s), order.end());
  };
  for (std::size_t s : stuck) {
    drop_from(plan.gpu_order, s);
    drop_from(plan.cpu_order, s);
    plan.subgroups[s].resident = true;
    plan.subgroups[s].device = planner::Device::gpu;
  }
  plan.gpu_order.insert(plan.gpu_order.begin(), stuck.begin(), stuck.end());
  plan.buffers = std::max<std::size_t>(plan.buffers, 1);
  return sent;
}

planner::Plan Executor::plan_with(const Policy& policy, std::uint64_t headroom_bytes,
                                  bool gradients_on_gpu, std::uint64_t held_bytes) const {
  planner::Workload w;
  w.subgroup_params = state_.sizes();
  w.footprint = footprint(gradients_on_gpu);
  w.headroom_bytes = capped(headroom_bytes);
  const planner::Rates& r = refiner_.rates();
  std::optional<planner::Plan> chosen;
  switch (policy.kind) {
    case Policy::Kind::cpu:
      break;
    case Policy::Kind::gpu: {
      std::vector<std::size_t> all;
      for (std::size_t i = 0; i < state_.size(); ++i) {
        if (!state_.pageable(i)) all.push_back(i);
      }
      chosen = planner::plan_for_order(w, r, all, options_.planner);
      break;
    }
    case Policy::Kind::interleave:
      if (policy.k < 1) throw std::invalid_argument("tide: interleave policy needs K >= 1");
      chosen = planner::plan_interleaved(w, r, policy.k, options_.planner);
      break;
    case Policy::Kind::first: {
      std::vector<std::size_t> order;
      for (std::size_t i = 0; i < std::min(policy.k, state_.size()); ++i) {
        if (!state_.pageable(i)) order.push_back(i);
      }
      chosen = planner::plan_for_order(w, r, order, options_.planner);
      break;
    }
    case Policy::Kind::automatic: {
      const std::vector<char> resident =
          choose_resident(policy, std::min(held_bytes, w.headroom_bytes));
      chosen = planner::plan_allowed(w, r, gpu_allowed(), options_.planner);
      if (std::find(resident.begin(), resident.end(), 1) != resident.end()) {
        // Resident subgroups take the held memory first: where only some fit, the copied-in
        // subgroups may lose their lanes and kept gradients to them. Only where the model
        // predicts it no slower (bench_iteration's published variant: 9 resident subgroups
        // left 41 on the CPU, 1.21x slower than without).
        // Decided on the steady state (a join is paid once); the plan says what this phase
        // costs, the joining states' copies in included.
        planner::ResidentPlan with = plan_around_resident(w, resident);
        if (planner::prefer_resident(with, *chosen, residency_.count() > 0,
                                     options_.residency_hysteresis)) {
          return std::move(with.plan);
        }
      }
      break;
    }
  }
  // Whatever the policy, pageable subgroups stay on the CPU (optimizer_state.h).
  return chosen ? planner::without_disallowed(*chosen, w, r, gpu_allowed(), options_.planner)
                : planner::all_cpu_plan(w, r);
}

std::vector<char> Executor::gpu_allowed() const {
  if (state_.pageable_subgroups() == 0) return {};
  std::vector<char> allowed(state_.size());
  for (std::size_t s = 0; s < state_.size(); ++s) allowed[s] = state_.pageable(s) ? 0 : 1;
  return allowed;
}

std::optional<planner::Plan> Executor::plan_keeping_gradients(const Policy& policy,
                                                              std::uint64_t holdable,
                                                              std::uint64_t held) {
  // Without a forecast of the update's own headroom (no iteration seen, not tide's allocator)
  // there is nothing to compare with, and nothing could take the buffers back.
  const std::optional<std::uint64_t> update_headroom = buffers_.update_headroom();
  if (!update_headroom || state_.host_params()) return std::nullopt;
  planner::Plan with = plan_with(policy, holdable, true, held);
  if (with.gpu_order.empty()) return std::nullopt;
  const planner::Plan without = plan_with(policy, *update_headroom, false, held);
  if (with.predicted.phase_s > without.predicted.phase_s) return std::nullopt;
  return with;
}

const planner::Plan* Executor::prepare_nothing() {
  // Resident subgroups keep the gradient routes the last phase gave them; where an earlier
  // prepare() changed the routes, keep_resident_gradients() gives them again.
  if (prepared_) {
    prepared_.reset();
    buffers_.clear_gradients();
    offload_->route({});
    keep_resident_gradients();
  }
  offer_to_reclaim();
  return nullptr;
}

const planner::Plan* Executor::prepare(const Policy& policy, std::uint64_t headroom_bytes) {
  const std::lock_guard lock(residency_mutex_);
  const driver::ContextScope scope(context_);
  offload_->synchronize_all();  // no copy may be in flight to a buffer being re-routed
  // Kept gradients are held through the forward and backward passes: no more than may be held.
  const std::uint64_t held = options_.residency ? residency_held(headroom_bytes) : 0;
  const bool keep = options_.gradients_on_gpu != KeptGradients::no;
  if (keep) headroom_bytes = buffers_.holdable(headroom_bytes);
  std::optional<planner::Plan> chosen;
  if (options_.gradients_on_gpu == KeptGradients::automatic) {
    chosen = plan_keeping_gradients(policy, headroom_bytes, held);
    if (!chosen) return prepare_nothing();
  }
  buffers_.clear_gradients();
  offload_->route({});
  prepared_ = chosen ? std::move(chosen) : plan_with(policy, headroom_bytes, keep, held);
  if (keep && !prepared_->gpu_order.empty()) {
    std::vector<CUdeviceptr> route(state_.size(), 0);
    // Automatic: their gradients reach pinned memory too, so that a step stays exact or changes
    // nothing whatever the device does; not where the device holds the only current state (a
    // resident subgroup's is lost with it anyway).
    const bool automatic = options_.gradients_on_gpu == KeptGradients::automatic;
    std::vector<char> mirrored(state_.size(), 0);
    try {
      for (std::size_t s : prepared_->gpu_order) {
        route[s] = buffers_.add_gradient(state_.params(s) * state_.grad_bytes(), compute_->get());
        mirrored[s] = automatic && !residency_.device_current(s) ? 1 : 0;
      }
      offload_->route(std::move(route), std::move(mirrored));
    } catch (...) {
      if (!out_of_memory(std::current_exception())) throw;
      // No room for the gradients on the GPU: they go to host memory, later plans get less
      // headroom, and the plan is made again without them (automatic: by run(), with the
      // update's headroom; resident subgroups' gradients routed as after the last phase).
      headroom_cap_ = std::max<std::uint64_t>(buffers_.gradient_bytes(), 1);
      buffers_.clear_gradients();
      if (automatic) return prepare_nothing();
      prepared_ = plan_with(policy, headroom_bytes, false, held);
    }
  }
  offer_to_reclaim();  // a forward pass past the forecast takes the kept gradients back
  return &*prepared_;
}

}  // namespace tide::runtime
