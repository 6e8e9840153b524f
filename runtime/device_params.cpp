#include "runtime/device_params.h"

#include <cstring>
#include <stdexcept>

#include "driver/memory.h"

namespace tide::runtime {

DeviceParams::DeviceParams(OptimizerState& state, const FrozenSlices& frozen,
                           const driver::PrimaryContext& context, unsigned cpu_threads)
    : state_(state), frozen_(frozen), context_(context), cpu_threads_(cpu_threads) {
  host_.assign(state.size(), 1);
  for (std::size_t s = 0; s < state.size(); ++s) {
    for (const ParamSlice& slice : state.spec(s).slices) {
      if (!driver::host_addressable(slice.device_ptr)) host_[s] = 0;
    }
  }
}

void DeviceParams::set_gradient(std::size_t, std::size_t, const void*) {
  throw std::logic_error("tide: executor: host gradients need host-resident parameters");
}

GradientStats DeviceParams::gradient_stats(const GradientOffload& offload) const {
  const driver::ContextScope scope(context_);  // waits for the offloads
  return runtime::gradient_stats(state_, offload);
}

// The whole slot, with the gradient in its pinned buffer; the new low-precision weights go to
// the weight copy (uploaded after), fp32 or bf16 master weights are the state itself.
std::uint64_t DeviceParams::cpu_update(std::size_t s, const kernels::AdamHyper& hyper,
                                       const kernels::CpuAdamOptions& options) const {
  kernels::AdamSubgroup sub;
  sub.grad = state_.grad(s);
  if (state_.bf16_master()) {
    sub.master_dtype = kernels::Dtype::kBFloat16;
    sub.param_bf16 = state_.master_bf16(s);
    sub.param_comp = state_.master_comp(s);
  } else {
    sub.param = state_.param(s);
  }
  sub.exp_avg = state_.exp_avg(s);
  sub.exp_avg_sq = state_.exp_avg_sq(s);
  sub.param_copy = state_.weight_copy(s);
  sub.count = state_.params(s);
  sub.grad_dtype = state_.options().grad_dtype;
  sub.state_dtype = state_.options().state_dtype;
  sub.state_format = state_.options().state_format;
  sub.exp_avg_scale = state_.exp_avg_scale(s);
  sub.exp_avg_sq_scale = state_.exp_avg_sq_scale(s);
  sub.copy_dtype =
      state_.separate_weights() ? state_.options().param_dtype : kernels::Dtype::kBFloat16;
  sub.moment_rounding = state_.moment_rounding();
  sub.rounding_index = state_.first_index(s);
  return kernels::cpu_adam_step(sub, hyper, options).nonfinite;
}

void DeviceParams::upload(std::size_t s, const driver::Stream& stream) const {
  // fp32 parameters and bf16 master weights are the state itself.
  const char* src = state_.separate_weights() ? static_cast<const char*>(state_.weight_copy(s))
                                              : reinterpret_cast<const char*>(state_.param(s));
  const unsigned size = state_.param_bytes();
  const std::vector<ParamSlice>& slices = state_.spec(s).slices;
  for (std::size_t k = 0; k < slices.size(); ++k) {
    if (frozen_.frozen(s, k)) continue;
    driver::copy_to_device_async(slices[k].device_ptr, src + slices[k].offset * size,
                                 slices[k].count * size, stream);
  }
}

void DeviceParams::write(std::size_t s) const {
  const char* src = reinterpret_cast<const char*>(state_.param(s));
  if (state_.separate_weights()) {
    // The cast the update would have written (round to nearest even, as every kernel does).
    kernels::cpu_cast(state_.param(s), state_.weight_copy(s), state_.options().param_dtype,
                      state_.params(s), kernels::CpuAdamOptions{.threads = cpu_threads_});
    src = static_cast<const char*>(state_.weight_copy(s));
  }
  const unsigned size = state_.param_bytes();
  const std::vector<ParamSlice>& slices = state_.spec(s).slices;
  for (std::size_t k = 0; k < slices.size(); ++k) {
    if (frozen_.frozen(s, k)) continue;
    if (host_[s]) {
      std::memcpy(reinterpret_cast<void*>(slices[k].device_ptr), src + slices[k].offset * size,
                  slices[k].count * size);
    } else {
      driver::copy_to_device(slices[k].device_ptr, src + slices[k].offset * size,
                             slices[k].count * size);
    }
  }
}

void DeviceParams::copy_gradient_in(std::size_t s, CUdeviceptr to, Range range,
                                    const driver::Stream& stream) const {
  const unsigned gs = state_.grad_bytes();
  driver::copy_to_device_async(to + range.first * gs,
                               static_cast<const char*>(state_.grad(s)) + range.first * gs,
                               range.count * gs, stream);
}

bool DeviceParams::write_committed(std::size_t s, CUdeviceptr weights, const void*,
                                   const driver::Stream& stream) const {
  // param_bytes() per parameter: the weight copy's, or the state's own weights (fp32 or bf16).
  const unsigned ps = state_.param_bytes();
  const std::vector<ParamSlice>& slices = state_.spec(s).slices;
  for (std::size_t k = 0; k < slices.size(); ++k) {
    if (frozen_.frozen(s, k)) continue;
    driver::copy_on_device_async(slices[k].device_ptr, weights + slices[k].offset * ps,
                                 slices[k].count * ps, stream);
  }
  return true;
}

}  // namespace tide::runtime
