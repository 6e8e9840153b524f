#include "runtime/executor.h"

#include <algorithm>
#include <stdexcept>

#include "config/env.h"
#include "config/placement.h"
#include "driver/stream_pool.h"
#include "kernels/adam_gpu.h"
#include "kernels/cpu_adam.h"
#include "kernels/dtype.h"
#include "planner/interleave.h"
#include "planner/node_rates.h"
#include "planner/rate_sources.h"
#include "runtime/device_params.h"
#include "runtime/host_params.h"
#include "runtime/memory_pressure.h"

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
      frozen_(state_) {
  if (state_.host_params() && options_.gradients_on_gpu) {
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
    const driver::ContextScope scope(context_);
    settle();
    synchronize_streams();
    buffers_.clear_gradients();
    buffers_.clear();
  } catch (...) {
    buffers_.leak();
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
  const driver::ContextScope scope(context_);
  settle();
  buffers_.clear();
}

void Executor::write_params(std::size_t s) {
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
  if (options_.cpu_update_factors) f.calibrate_cpu(*options_.cpu_update_factors);
  return f;
}

std::uint64_t Executor::capped(std::uint64_t headroom) const {
  return headroom_cap_ ? std::min(headroom, headroom_cap_) : headroom;
}

bool Executor::needs_staging(bool gradients_on_gpu) const {
  return state_.separate_weights() &&
         (gradients_on_gpu || state_.grad_bytes() != state_.param_bytes());
}

planner::Plan Executor::plan_for(const Policy& policy, std::uint64_t headroom_bytes) const {
  return plan_with(policy, headroom_bytes, options_.gradients_on_gpu);
}

planner::Plan Executor::plan_with(const Policy& policy, std::uint64_t headroom_bytes,
                                  bool gradients_on_gpu) const {
  planner::Workload w;
  w.subgroup_params = state_.sizes();
  w.footprint = footprint(gradients_on_gpu);
  // The kernel writes the low-precision weights into the buffer, and copies take them to the
  // model once the subgroup is committed: over the gradient it has just read when that is in
  // the buffer and of the same size, else into a staging area of their own. Leave room for it
  // by planning with proportionally less headroom.
  std::uint64_t headroom = capped(headroom_bytes);
  if (needs_staging(gradients_on_gpu)) {
    const double per = static_cast<double>(w.footprint.h2d_bytes_per_param());
    headroom = static_cast<std::uint64_t>(static_cast<double>(headroom) * per /
                                          (per + state_.param_bytes()));
  }
  w.headroom_bytes = headroom;
  const planner::Rates& r = refiner_.rates();
  std::optional<planner::Plan> chosen;
  switch (policy.kind) {
    case Policy::Kind::cpu:
      break;
    case Policy::Kind::gpu: {
      std::vector<std::size_t> all(state_.size());
      for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
      chosen = planner::plan_for_order(w, r, all, options_.planner);
      break;
    }
    case Policy::Kind::interleave:
      if (policy.k < 1) throw std::invalid_argument("tide: interleave policy needs K >= 1");
      chosen = planner::plan_interleaved(w, r, policy.k, options_.planner);
      break;
    case Policy::Kind::first: {
      std::vector<std::size_t> order(std::min(policy.k, state_.size()));
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
      chosen = planner::plan_for_order(w, r, order, options_.planner);
      break;
    }
    case Policy::Kind::automatic:
      chosen = plan(w, r, options_.planner);
      break;
  }
  return chosen ? *chosen : planner::all_cpu_plan(w, r);
}

const planner::Plan& Executor::prepare(const Policy& policy, std::uint64_t headroom_bytes) {
  const driver::ContextScope scope(context_);
  offload_->synchronize_all();  // no copy may be in flight to a buffer being re-routed
  buffers_.clear_gradients();
  offload_->route({});
  // Kept gradients are held through the forward and backward passes: no more than may be held.
  if (options_.gradients_on_gpu) headroom_bytes = buffers_.holdable(headroom_bytes);
  prepared_ = plan_with(policy, headroom_bytes, options_.gradients_on_gpu);
  if (options_.gradients_on_gpu && !prepared_->gpu_order.empty()) {
    std::vector<CUdeviceptr> route(state_.size(), 0);
    try {
      for (std::size_t s : prepared_->gpu_order) {
        route[s] = buffers_.add_gradient(state_.params(s) * state_.grad_bytes(), compute_->get());
      }
      offload_->route(std::move(route));
    } catch (...) {
      if (!out_of_memory(std::current_exception())) throw;
      // No room for the gradients on the GPU: they go to host memory, the plan is made again
      // without them, and later plans get less headroom.
      headroom_cap_ = std::max<std::uint64_t>(buffers_.gradient_bytes(), 1);
      buffers_.clear_gradients();
      prepared_ = plan_with(policy, headroom_bytes, false);
    }
  }
  return *prepared_;
}

}  // namespace tide::runtime
