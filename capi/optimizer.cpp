// The executor's part of the C ABI (include/tide/tide.h, "executor"): the offloading optimizer's
// state, gradient offload and update phase, for the Python layer.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "allocator/device/device_registry.h"
#include "capi/kernels.h"
#include "capi/optimizer.h"
#include "capi/planner.h"
#include "capi/status.h"
#include "capi/versioned.h"
#include "planner/rate_sources.h"
#include "planner/rates.h"
#include "runtime/executor.h"
#include "runtime/gradient_stats.h"
#include "tide/tide.h"

static_assert(TIDE_QUANT_BLOCK == tide::kernels::kQuantBlock);

struct tide_optimizer {
  // Held for the whole life of the state, which goes first (members end in reverse order).
  std::unique_ptr<tide::driver::PrimaryContext> context;
  std::unique_ptr<tide::runtime::OptimizerState> state;
  std::unique_ptr<tide::runtime::Executor> executor;
  // Each create-time slice: its subgroup and its position among that subgroup's slices.
  std::vector<std::pair<std::size_t, std::size_t>> slices;
  int device = 0;
  // tide_step_result.reason of the last step.
  std::string reason;
};

namespace tide::capi {

runtime::Policy placement_from_c(const tide_placement_policy& policy) {
  using runtime::Policy;
  switch (policy.kind) {
    case TIDE_PLACEMENT_AUTO:
      return Policy::automatic_policy();
    case TIDE_PLACEMENT_CPU:
      return Policy::all_cpu();
    case TIDE_PLACEMENT_GPU:
      return Policy::all_gpu();
    case TIDE_PLACEMENT_INTERLEAVE:
      require(policy.k >= 1, "tide_optimizer: TIDE_PLACEMENT_INTERLEAVE needs k >= 1");
      return Policy::every(static_cast<std::size_t>(policy.k));
    default:
      throw std::invalid_argument("tide_optimizer: unknown placement policy kind " +
                                  std::to_string(policy.kind));
  }
}

tide_placement_policy placement_to_c(const runtime::Policy& policy) {
  using Kind = runtime::Policy::Kind;
  switch (policy.kind) {
    case Kind::cpu:
      return {TIDE_PLACEMENT_CPU, 0};
    case Kind::gpu:
      return {TIDE_PLACEMENT_GPU, 0};
    case Kind::interleave:
      return {TIDE_PLACEMENT_INTERLEAVE, static_cast<int32_t>(policy.k)};
    case Kind::automatic:
    case Kind::first:  // not a policy of the C ABI
      break;
  }
  return {TIDE_PLACEMENT_AUTO, 0};
}

}  // namespace tide::capi

namespace {

using tide::allocator::device::device_allocator;
using tide::capi::rates_from_c;
using tide::capi::require;

using namespace tide::planner;
using namespace tide::runtime;
using tide::kernels::Dtype;

Dtype dtype_of(int32_t d, const char* what) {
  return tide::capi::dtype_from_c(d, std::string("tide_optimizer: ") + what);
}

Policy policy_of(const tide_placement_policy* policy) {
  if (policy == nullptr) return policy_from_env(Policy::automatic_policy());
  return tide::capi::placement_from_c(*policy);
}

tide_optimizer& checked(tide_optimizer* optimizer) {
  require(optimizer != nullptr, "tide_optimizer: null optimizer");
  return *optimizer;
}
const tide_optimizer& checked(const tide_optimizer* optimizer) {
  require(optimizer != nullptr, "tide_optimizer: null optimizer");
  return *optimizer;
}

// The factors a caller gave, checked field by field.
CpuUpdateFactors factors_from_c(const tide_cpu_update_factors& given_by_caller) {
  const tide_cpu_update_factors c = tide::capi::read_versioned(
      given_by_caller, tide_cpu_update_factors_default(), "tide_cpu_update_factors");
  struct Field {
    UpdateFormat format;
    const char* name;
    double free;
    const char* contended_name;
    double contended;
  };
  const Field fields[] = {
      {UpdateFormat::bf16_moments, "bf16_moments", c.bf16_moments, "bf16_moments_contended",
       c.bf16_moments_contended},
      {UpdateFormat::q8_moments, "q8_moments", c.q8_moments, "q8_moments_contended",
       c.q8_moments_contended},
      {UpdateFormat::bf16_master, "bf16_master", c.bf16_master, "bf16_master_contended",
       c.bf16_master_contended},
      {UpdateFormat::bf16_master_bf16_moments, "bf16_master_bf16_moments",
       c.bf16_master_bf16_moments, "bf16_master_bf16_moments_contended",
       c.bf16_master_bf16_moments_contended},
  };
  static_assert(std::size(fields) == kUpdateFormatCount);
  CpuUpdateFactors out;
  auto check = [](const char* name, double factor) {
    require(factor == 0 || plausible_cpu_update_factor(factor),
            std::string("tide_optimizer_create: factors->") + name + " is " +
                std::to_string(factor) +
                ": must be 0 (not measured: the model's) or a number from 0.01 to 100 (the "
                "format's CPU update rate over fp32 state's)");
  };
  for (const Field& f : fields) {
    check(f.name, f.free);
    check(f.contended_name, f.contended);
    out[f.format] = f.free;
    out.contended[static_cast<std::size_t>(f.format)] = f.contended;
  }
  return out;
}

// A host memory rate the caller gave: bytes/s within what its TIDE_RATE_* knob takes.
double host_memory_rate(double bytes_per_s, RateKind kind, const char* field) {
  const RateInfo& info = rate_info(kind);
  const double low = info.min_given * info.scale, high = info.max_given * info.scale;
  require(std::isfinite(bytes_per_s) && bytes_per_s >= low && bytes_per_s <= high,
          std::string("tide_optimizer_create: ") + field +
              " must be 0 (the built-in rate) or bytes/s from " + std::to_string(low) + " to " +
              std::to_string(high) + ", not " + std::to_string(bytes_per_s));
  return bytes_per_s;
}

tide_optimizer_options default_options() {
  tide_optimizer_options o{};
  o.struct_size = sizeof(tide_optimizer_options);
  o.grad_dtype = TIDE_BFLOAT16;
  o.param_dtype = TIDE_BFLOAT16;
  o.refine = 1;
  o.gradients_on_gpu = TIDE_GRADIENTS_AUTO;
  return o;
}

// The options' dtypes as the runtime's; the rules between them are the runtime's
// (check_state_options), checked when the state is made.
StateOptions state_options_from_c(const tide_optimizer_options& o) {
  StateOptions so;
  so.grad_dtype = dtype_of(o.grad_dtype, "grad_dtype");
  so.param_dtype = dtype_of(o.param_dtype, "param_dtype");
  if (o.state_dtype == TIDE_STATE_BLOCK_Q8) {
    so.state_format = tide::kernels::StateFormat::kBlockQ8;
  } else {
    require(o.state_dtype == TIDE_FLOAT32 || o.state_dtype == TIDE_BFLOAT16,
            "tide_optimizer_create: state_dtype must be TIDE_FLOAT32, TIDE_BFLOAT16 or "
            "TIDE_STATE_BLOCK_Q8 (the moments' format)");
    so.state_dtype = dtype_of(o.state_dtype, "state_dtype");
  }
  require(o.master_dtype == TIDE_FLOAT32 || o.master_dtype == TIDE_BFLOAT16,
          "tide_optimizer_create: master_dtype must be TIDE_FLOAT32 or TIDE_BFLOAT16 (the "
          "master weights' format)");
  so.master_dtype = dtype_of(o.master_dtype, "master_dtype");
  so.host_params = o.host_params != 0;
  return so;
}

tide_subgroup_buffers buffers_of(const tide_optimizer& o, std::size_t subgroup) {
  // No fp32 master with bf16 master weights: tide_optimizer_master_bf16 has them.
  float* param = o.state->bf16_master() ? nullptr : o.state->param(subgroup);
  return tide_subgroup_buffers{param, o.state->exp_avg(subgroup), o.state->exp_avg_sq(subgroup),
                               o.state->grad(subgroup), o.state->params(subgroup)};
}

void set_frozen(tide_optimizer& o, const uint8_t* frozen, std::size_t slice_count) {
  require(slice_count == o.slices.size(),
          "tide_optimizer_set_frozen: slice_count is " + std::to_string(slice_count) +
              ", the optimizer was created with " + std::to_string(o.slices.size()));
  require(slice_count == 0 || frozen != nullptr, "tide_optimizer_set_frozen: null array");
  for (std::size_t i = 0; i < slice_count; ++i) {
    o.executor->set_frozen(o.slices[i].first, o.slices[i].second, frozen[i] != 0);
  }
}

// How the phase ended, its numbers, and the caller's per-subgroup arrays.
void fill_result(tide_optimizer& o, const PhaseReport& r, tide_step_result& out) {
  out.seconds = r.seconds;
  out.predicted_seconds = r.ran.predicted.phase_s;
  out.all_cpu_seconds = r.ran.predicted.all_cpu_s;
  out.cpu_busy_seconds = r.cpu_seconds;
  out.gpu_subgroups = 0;
  out.gpu_params = 0;
  for (const tide::planner::SubgroupPlan& sub : r.ran.subgroups) {
    if (sub.device != Device::gpu) continue;
    ++out.gpu_subgroups;
    out.gpu_params += sub.params;
  }
  out.cpu_subgroups = r.ran.subgroups.size() - out.gpu_subgroups;
  out.fallback_subgroups = r.fallback_subgroups;
  out.resident_subgroups = r.resident_subgroups;
  out.resident_bytes = r.resident_bytes;
  out.evicted_subgroups = r.pressure.evicted_subgroups;
  out.evicted_bytes = r.pressure.evicted_bytes;
  out.evict_seconds = r.pressure.evict_seconds;
  out.cache_releases = r.pressure.cache_releases;
  out.withdrawn_gradients = r.pressure.withdrawn_gradients;
  out.withdrawn_bytes = r.pressure.withdrawn_bytes;
  out.kept_gradients = r.kept_gradients;
  out.gpu_busy_seconds = r.gpu_seconds;
  out.h2d_busy_seconds = r.h2d_seconds;
  out.d2h_busy_seconds = r.d2h_seconds;
  out.buffers_in_flight = r.ran.buffers;
  out.gpu_bytes = r.ran.gpu_bytes();
  out.nonfinite = r.nonfinite;
  out.headroom_cap = r.headroom_cap;
  out.rolled_forward = r.rolled_forward;
  out.unwritten = r.unwritten.size();
  out.not_updated = r.not_updated.size();
  if (!r.not_updated.empty()) {
    out.outcome = TIDE_STEP_INCOMPLETE;
    o.reason = std::to_string(r.not_updated.size()) +
               " subgroups could not be updated (their gradients were kept on the GPU, or their "
               "state was resident there, and it failed: " +
               r.fault + "); the others were";
  } else if (!r.unwritten.empty()) {
    out.outcome = TIDE_STEP_COMPLETED_AFTER_FAULT;
    o.reason = "the step completed, but the model's parameters of " +
               std::to_string(r.unwritten.size()) +
               " subgroups could not be written from the new master weights: " + r.fault;
  } else if (!r.fault.empty()) {
    out.outcome = TIDE_STEP_COMPLETED_AFTER_FAULT;
    o.reason = "completed after a fault (" + std::to_string(r.rolled_forward) +
               " subgroups redone on the CPU): " + r.fault;
  }
  const std::size_t n = o.state->size();
  if (out.subgroup_outcome != nullptr) {
    std::fill(out.subgroup_outcome, out.subgroup_outcome + n, TIDE_SUBGROUP_UPDATED);
    for (std::size_t s : r.unwritten) out.subgroup_outcome[s] = TIDE_SUBGROUP_UNWRITTEN;
    for (std::size_t s : r.not_updated) out.subgroup_outcome[s] = TIDE_SUBGROUP_NOT_UPDATED;
  }
  if (out.plan_device != nullptr) {
    for (std::size_t i = 0; i < r.ran.subgroups.size() && i < n; ++i) {
      out.plan_device[i] = r.ran.subgroups[i].device == Device::gpu ? 1 : 0;
    }
  }
}

}  // namespace

extern "C" {

TIDE_API tide_status tide_optimizer_options_init(tide_optimizer_options* options) {
  return tide::capi::guard([&] {
    require(options != nullptr, "tide_optimizer_options_init: null pointer");
    tide::capi::write_versioned(options, default_options(), "tide_optimizer_options");
  });
}

TIDE_API tide_status tide_optimizer_options_check(const tide_optimizer_options* options) {
  return tide::capi::guard([&] {
    require(options != nullptr, "tide_optimizer_options_check: null pointer");
    check_state_options(state_options_from_c(
        tide::capi::read_versioned(*options, default_options(), "tide_optimizer_options")));
  });
}

TIDE_API tide_status tide_optimizer_create(const uint64_t* subgroup_params, size_t count,
                                           const tide_param_slice* slices, size_t slice_count,
                                           const tide_optimizer_options* options,
                                           const tide_cpu_update_factors* factors,
                                           tide_optimizer** optimizer) {
  return tide::capi::guard([&] {
    require(optimizer != nullptr, "tide_optimizer_create: null output pointer");
    std::optional<CpuUpdateFactors> given_factors;
    if (factors != nullptr) given_factors = factors_from_c(*factors);
    require(count > 0 && subgroup_params != nullptr, "tide_optimizer_create: no subgroups");
    require(slice_count == 0 || slices != nullptr, "tide_optimizer_create: null slices");
    const tide_optimizer_options o =
        options != nullptr
            ? tide::capi::read_versioned(*options, default_options(), "tide_optimizer_options")
            : default_options();
    std::vector<SubgroupSpec> specs(count);
    for (size_t i = 0; i < count; ++i) specs[i].params = subgroup_params[i];
    for (size_t i = 0; i < slice_count; ++i) {
      const tide_param_slice& s = slices[i];
      require(s.subgroup < count, "tide_optimizer_create: slice " + std::to_string(i) +
                                      " names subgroup " + std::to_string(s.subgroup) + " of " +
                                      std::to_string(count));
      specs[s.subgroup].slices.push_back(ParamSlice{s.offset, s.count, s.device_ptr});
    }
    const StateOptions so = state_options_from_c(o);
    ExecutorOptions eo;
    eo.device = o.device;
    if (o.use_rates) {
      eo.rates = rates_from_c(o.rates);
      if (o.host_memory_rate != 0) {
        eo.rates->host_memory =
            host_memory_rate(o.host_memory_rate, RateKind::host_memory, "host_memory_rate");
      }
      if (o.host_memory_contended_rate != 0) {
        eo.rates->host_memory_contended =
            host_memory_rate(o.host_memory_contended_rate, RateKind::host_memory_contended,
                             "host_memory_contended_rate");
      }
    }
    require(o.gradients_on_gpu >= TIDE_GRADIENTS_HOST && o.gradients_on_gpu <= TIDE_GRADIENTS_AUTO,
            "tide_optimizer_create: gradients_on_gpu must be TIDE_GRADIENTS_HOST (0), "
            "TIDE_GRADIENTS_GPU (1) or TIDE_GRADIENTS_AUTO (2), not " +
                std::to_string(o.gradients_on_gpu));
    eo.gradients_on_gpu = o.gradients_on_gpu == TIDE_GRADIENTS_GPU    ? KeptGradients::yes
                          : o.gradients_on_gpu == TIDE_GRADIENTS_AUTO ? KeptGradients::automatic
                                                                      : KeptGradients::no;
    eo.residency = tide::runtime::residency_from_env();
    eo.gpu_chunk_params = tide::runtime::gpu_chunk_from_env();
    eo.planner.max_buffers = o.max_buffers;
    eo.refine = o.refine != 0;
    require(o.cpu_threads >= 0 && o.cpu_threads <= 1024,
            "tide_optimizer_create: cpu_threads must be 0 (all) to 1024");
    eo.cpu_threads = static_cast<unsigned>(o.cpu_threads);
    eo.cpu_update_factors = given_factors;
    auto result = std::make_unique<tide_optimizer>();
    result->device = o.device;
    result->context = std::make_unique<tide::driver::PrimaryContext>(o.device);
    result->state = std::make_unique<OptimizerState>(std::move(specs), so);
    result->executor = std::make_unique<Executor>(*result->state, eo);
    for (size_t i = 0; i < slice_count; ++i) {
      const std::vector<ParamSlice>& placed = result->state->spec(slices[i].subgroup).slices;
      const auto at = std::find_if(placed.begin(), placed.end(), [&](const ParamSlice& p) {
        return p.offset == slices[i].offset;
      });
      result->slices.emplace_back(slices[i].subgroup, at - placed.begin());
    }
    *optimizer = result.release();
  });
}

TIDE_API tide_status tide_optimizer_destroy(tide_optimizer* optimizer) {
  return tide::capi::guard([&] {
    // The executor, then the state, then the context's share: each makes the context current
    // for what it gives back (driver/context.h).
    delete optimizer;
  });
}

TIDE_API tide_status tide_optimizer_buffers(tide_optimizer* optimizer, size_t subgroup,
                                            tide_subgroup_buffers* buffers) {
  return tide::capi::guard([&] {
    tide_optimizer& o = checked(optimizer);
    require(buffers != nullptr, "tide_optimizer_buffers: null output pointer");
    require(subgroup < o.state->size(), "tide_optimizer_buffers: subgroup " +
                                            std::to_string(subgroup) + " of " +
                                            std::to_string(o.state->size()));
    *buffers = buffers_of(o, subgroup);
  });
}

TIDE_API tide_status tide_optimizer_master_bf16(tide_optimizer* optimizer, size_t subgroup,
                                                uint16_t** weights, uint16_t** compensation) {
  return tide::capi::guard([&] {
    tide_optimizer& o = checked(optimizer);
    require(weights != nullptr && compensation != nullptr,
            "tide_optimizer_master_bf16: null output pointer");
    require(subgroup < o.state->size(), "tide_optimizer_master_bf16: subgroup " +
                                            std::to_string(subgroup) + " of " +
                                            std::to_string(o.state->size()));
    *weights = o.state->master_bf16(subgroup);
    *compensation = o.state->master_comp(subgroup);
  });
}

TIDE_API tide_status tide_optimizer_set_state_rounding(tide_optimizer* optimizer, int32_t rounding,
                                                       uint64_t seed) {
  return tide::capi::guard([&] {
    tide_optimizer& o = checked(optimizer);
    require(
        rounding == TIDE_STATE_ROUNDING_NEAREST || rounding == TIDE_STATE_ROUNDING_STOCHASTIC,
        "tide_optimizer_set_state_rounding: rounding must be TIDE_STATE_ROUNDING_NEAREST (0) or "
        "TIDE_STATE_ROUNDING_STOCHASTIC (1)");
    o.state->set_moment_rounding(rounding == TIDE_STATE_ROUNDING_STOCHASTIC
                                     ? tide::kernels::MomentRounding::kStochastic
                                     : tide::kernels::MomentRounding::kNearest,
                                 seed);
  });
}

TIDE_API tide_status tide_optimizer_q8_scales(tide_optimizer* optimizer, size_t subgroup,
                                              float** exp_avg_scale, float** exp_avg_sq_scale,
                                              uint64_t* blocks) {
  return tide::capi::guard([&] {
    tide_optimizer& o = checked(optimizer);
    require(exp_avg_scale != nullptr && exp_avg_sq_scale != nullptr && blocks != nullptr,
            "tide_optimizer_q8_scales: null output pointer");
    require(subgroup < o.state->size(), "tide_optimizer_q8_scales: subgroup " +
                                            std::to_string(subgroup) + " of " +
                                            std::to_string(o.state->size()));
    *exp_avg_scale = o.state->exp_avg_scale(subgroup);
    *exp_avg_sq_scale = o.state->exp_avg_sq_scale(subgroup);
    *blocks = o.state->quantized() ? tide::kernels::quant_blocks(o.state->params(subgroup)) : 0;
  });
}

TIDE_API tide_status tide_optimizer_offload_gradient(tide_optimizer* optimizer, size_t subgroup,
                                                     uint64_t offset, uint64_t src, uint64_t count,
                                                     int32_t dtype, void* stream) {
  return tide::capi::guard([&] {
    tide_optimizer& o = checked(optimizer);
    const tide::driver::ContextScope scope(*o.context);
    o.executor->offload().offload(subgroup, offset, src, count, dtype_of(dtype, "dtype"),
                                  static_cast<CUstream>(stream));
  });
}

TIDE_API tide_status tide_optimizer_offload_stream(tide_optimizer* optimizer, void** stream) {
  return tide::capi::guard([&] {
    tide_optimizer& o = checked(optimizer);
    require(stream != nullptr, "tide_optimizer_offload_stream: null output pointer");
    *stream = o.executor->offload().stream().get();
  });
}

TIDE_API tide_status tide_optimizer_grad_stats(tide_optimizer* optimizer, double* sum_squares,
                                               uint64_t* nonfinite) {
  return tide::capi::guard([&] {
    tide_optimizer& o = checked(optimizer);
    const GradientStats stats = o.executor->gradient_stats();
    if (sum_squares) *sum_squares = stats.sum_squares;
    if (nonfinite) *nonfinite = stats.nonfinite;
  });
}

TIDE_API tide_status tide_optimizer_set_gradients(tide_optimizer* optimizer, const uint64_t* grads,
                                                  size_t slice_count) {
  return tide::capi::guard([&] {
    tide_optimizer& o = checked(optimizer);
    require(o.state->host_params(),
            "tide_optimizer_set_gradients: the optimizer was not created with host_params");
    require(slice_count == o.slices.size(),
            "tide_optimizer_set_gradients: slice_count is " + std::to_string(slice_count) +
                ", the optimizer was created with " + std::to_string(o.slices.size()));
    require(slice_count == 0 || grads != nullptr, "tide_optimizer_set_gradients: null array");
    for (std::size_t i = 0; i < slice_count; ++i) {
      o.executor->set_host_gradient(o.slices[i].first, o.slices[i].second,
                                    reinterpret_cast<const void*>(grads[i]));
    }
  });
}

TIDE_API tide_status tide_optimizer_release_buffers(tide_optimizer* optimizer) {
  return tide::capi::guard([&] {
    tide_optimizer& o = checked(optimizer);
    o.executor->release_buffers();
  });
}

TIDE_API tide_status tide_optimizer_sync_state(tide_optimizer* optimizer, int32_t written) {
  return tide::capi::guard([&] { checked(optimizer).executor->sync_state(written != 0); });
}

TIDE_API tide_status tide_optimizer_evict(tide_optimizer* optimizer, uint64_t max_bytes,
                                          uint64_t* freed) {
  return tide::capi::guard([&] {
    const std::uint64_t bytes = checked(optimizer).executor->evict(max_bytes);
    if (freed != nullptr) *freed = bytes;
  });
}

TIDE_API tide_status tide_optimizer_prepare(tide_optimizer* optimizer,
                                            const tide_placement_policy* policy,
                                            uint64_t headroom_bytes) {
  return tide::capi::guard([&] {
    tide_optimizer& o = checked(optimizer);
    o.executor->prepare(policy_of(policy), headroom_bytes);
  });
}

TIDE_API tide_status tide_optimizer_ready(tide_optimizer* optimizer, const tide_adam_hyper* hyper) {
  return tide::capi::guard([&] {
    tide_optimizer& o = checked(optimizer);
    require(hyper != nullptr, "tide_optimizer_ready: null hyperparameters");
    o.executor->ready(tide::capi::hyper_from_c(*hyper));
  });
}

TIDE_API tide_status tide_optimizer_step(tide_optimizer* optimizer,
                                         const tide_step_request* request,
                                         tide_step_result* result) {
  // Errors thrown here come before the step changed anything; what happened after is in the
  // result's outcome.
  bool happened = false;
  const tide_status status = tide::capi::guard([&] {
    tide_optimizer& o = checked(optimizer);
    require(request != nullptr && result != nullptr, "tide_optimizer_step: null argument");
    tide::capi::check_struct_size<tide_step_result>(result->struct_size, "tide_step_result");
    const tide_step_request q =
        tide::capi::read_versioned(*request, tide_step_request_default(), "tide_step_request");
    require((q.flags & ~(TIDE_STEP_HEADROOM_FORECAST | TIDE_STEP_MARK_PHASES |
                         TIDE_STEP_RELEASE_BUFFERS)) == 0,
            "tide_optimizer_step: unknown bits in request->flags");
    tide_step_result out = tide_step_result_default();
    out.subgroup_outcome = result->subgroup_outcome;
    out.plan_device = result->plan_device;
    out.buffers = result->buffers;
    o.reason.clear();
    out.reason = o.reason.c_str();
    tide::capi::write_versioned(result, out, "tide_step_result");  // what holds if it fails
    if (q.frozen != nullptr) set_frozen(o, q.frozen, q.frozen_count);
    const Policy policy = policy_of(q.policy);
    const int device = o.device;
    if ((q.flags & TIDE_STEP_MARK_PHASES) != 0) {
      device_allocator(device).mark(tide::allocator::telemetry::Mark::kUpdate);
    }
    const std::uint64_t headroom = (q.flags & TIDE_STEP_HEADROOM_FORECAST) != 0
                                       ? device_allocator(device).headroom().headroom
                                       : q.headroom_bytes;
    const PhaseReport& r = o.executor->run(tide::capi::hyper_from_c(q.hyper), policy, headroom);
    // From here the step happened: what follows only says how, and throws nothing.
    happened = true;
    fill_result(o, r, out);
    out.placement = tide::capi::placement_to_c(policy);
    out.headroom_bytes = headroom;
    tide::capi::write_versioned(result, out, "tide_step_result");
    // Tidying up after the step must not make it look undone: a failure is said in the reason.
    auto tidy = [&](const char* what, auto&& body) {
      try {
        body();
      } catch (const std::exception& e) {
        o.reason +=
            std::string(o.reason.empty() ? "" : "; ") + "after the step, " + what + ": " + e.what();
      }
    };
    if ((q.flags & TIDE_STEP_RELEASE_BUFFERS) != 0) {
      tidy("releasing the GPU buffers", [&] { o.executor->release_buffers(); });
    }
    if ((q.flags & TIDE_STEP_MARK_PHASES) != 0) {
      tidy("marking the iteration's end",
           [&] { device_allocator(device).mark(tide::allocator::telemetry::Mark::kIterationEnd); });
    }
    if (out.buffers != nullptr) {
      for (std::size_t i = 0; i < o.state->size(); ++i) out.buffers[i] = buffers_of(o, i);
    }
    out.reason = o.reason.c_str();
    tide::capi::write_versioned(result, out, "tide_step_result");
  });
  if (status != TIDE_OK && !happened && result != nullptr &&
      result->struct_size >= offsetof(tide_step_result, reason) + sizeof(const char*) &&
      result->struct_size <= sizeof(tide_step_result)) {
    // Not happened: the error's message is the reason (the optimizer's copy outlives the
    // thread's next call).
    tide_step_result out = tide_step_result_default();
    out.subgroup_outcome = result->subgroup_outcome;
    out.plan_device = result->plan_device;
    out.buffers = result->buffers;
    out.outcome = TIDE_STEP_NOT_HAPPENED;
    out.status = status;
    out.reason = tide::capi::last_error_text();
    if (optimizer != nullptr) {
      optimizer->reason = out.reason;
      out.reason = optimizer->reason.c_str();
    }
    out.struct_size = result->struct_size;
    std::memcpy(static_cast<void*>(result), &out, result->struct_size);
  }
  return status;
}

TIDE_API tide_status tide_optimizer_write_params(tide_optimizer* optimizer) {
  return tide::capi::guard([&] {
    tide_optimizer& o = checked(optimizer);
    for (std::size_t s = 0; s < o.state->size(); ++s) o.executor->write_params(s);
  });
}

TIDE_API tide_status tide_optimizer_set_frozen(tide_optimizer* optimizer, const uint8_t* frozen,
                                               size_t slice_count) {
  return tide::capi::guard([&] { set_frozen(checked(optimizer), frozen, slice_count); });
}

TIDE_API tide_status tide_optimizer_last_plan(const tide_optimizer* optimizer, uint8_t* device,
                                              uint32_t* order, tide_plan_summary* summary) {
  return tide::capi::guard([&] {
    const tide_optimizer& o = checked(optimizer);
    const Plan& p = o.executor->last_report().ran;
    require(!p.subgroups.empty(), "tide_optimizer_last_plan: no update phase has run yet");
    require(device != nullptr && order != nullptr, "tide_optimizer_last_plan: null array");
    for (std::size_t i = 0; i < p.subgroups.size(); ++i) {
      device[i] = p.subgroups[i].device == Device::gpu ? 1 : 0;
      order[i] = static_cast<uint32_t>(p.subgroups[i].position);
    }
    if (summary) {
      tide::capi::write_versioned(summary, tide::capi::summary_to_c(p), "tide_plan_summary");
    }
  });
}

TIDE_API tide_status tide_optimizer_last_timings(const tide_optimizer* optimizer,
                                                 tide_subgroup_timing* timings, size_t count) {
  return tide::capi::guard([&] {
    const tide_optimizer& o = checked(optimizer);
    const auto& t = o.executor->last_report().timings;
    require(count == 0 || timings != nullptr, "tide_optimizer_last_timings: null array");
    for (std::size_t i = 0; i < count && i < t.size(); ++i) {
      timings[i] =
          tide_subgroup_timing{t[i].cpu_update_s, t[i].h2d_s, t[i].gpu_update_s, t[i].d2h_s};
    }
  });
}

TIDE_API tide_status tide_optimizer_rates(const tide_optimizer* optimizer, tide_rates* rates) {
  return tide::capi::guard([&] {
    const tide_optimizer& o = checked(optimizer);
    require(rates != nullptr, "tide_optimizer_rates: null output pointer");
    const Rates& r = o.executor->rates();
    *rates = tide_rates{r.cpu_update, r.cpu_update_contended, r.h2d,       r.d2h,
                        r.h2d_duplex, r.d2h_duplex,           r.gpu_update};
  });
}

TIDE_API tide_status tide_optimizer_host_memory_rates(const tide_optimizer* optimizer,
                                                      tide_host_memory_rates* rates) {
  return tide::capi::guard([&] {
    const tide_optimizer& o = checked(optimizer);
    require(rates != nullptr, "tide_optimizer_host_memory_rates: null output pointer");
    tide::capi::write_versioned(rates, tide::capi::host_memory_rates_to_c(o.executor->rates()),
                                "tide_host_memory_rates");
  });
}

TIDE_API tide_status tide_optimizer_pageable(const tide_optimizer* optimizer, size_t* subgroups,
                                             uint64_t* bytes) {
  return tide::capi::guard([&] {
    const tide_optimizer& o = checked(optimizer);
    if (subgroups != nullptr) *subgroups = o.state->pageable_subgroups();
    if (bytes != nullptr) *bytes = o.state->pageable_bytes();
  });
}

}  // extern "C"
