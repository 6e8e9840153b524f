#include "runtime/host_params.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "allocator/pinned/arena.h"
#include "driver/memory.h"

namespace tide::runtime {

HostParams::HostParams(OptimizerState& state, const FrozenSlices& frozen)
    : state_(state), frozen_(frozen), grads_(state.size()) {
  for (std::size_t i = 0; i < state.size(); ++i) {
    grads_[i].assign(state.spec(i).slices.size(), nullptr);
  }
}

void HostParams::check_gradients() const {
  for (std::size_t i = 0; i < grads_.size(); ++i) {
    for (std::size_t k = 0; k < grads_[i].size(); ++k) {
      if (grads_[i][k] == nullptr && !frozen_.frozen(i, k)) {
        throw std::invalid_argument("tide: executor: subgroup " + std::to_string(i) + ", slice " +
                                    std::to_string(k) +
                                    ": no gradient given and not frozen (host-resident "
                                    "parameters read their gradients where they are)");
      }
    }
  }
}

GradientStats HostParams::gradient_stats(const GradientOffload&) const {
  std::vector<GradientPiece> pieces;
  for (std::size_t i = 0; i < state_.size(); ++i) {
    const std::vector<ParamSlice>& slices = state_.spec(i).slices;
    for (std::size_t k = 0; k < slices.size(); ++k) {
      if (grads_[i][k] != nullptr) pieces.push_back({grads_[i][k], slices[k].count});
    }
  }
  return runtime::gradient_stats(pieces, state_.options().grad_dtype);
}

void HostParams::forget_gradients() {
  for (auto& slices : grads_) std::fill(slices.begin(), slices.end(), nullptr);
}

// In place, slice by slice: the parameters and their gradients where they are; frozen slices are
// not touched at all.
std::uint64_t HostParams::cpu_update(std::size_t s, const kernels::AdamHyper& hyper,
                                     const kernels::CpuAdamOptions& options) const {
  std::uint64_t nonfinite = 0;
  const unsigned mb = state_.moment_bytes();
  const std::vector<ParamSlice>& slices = state_.spec(s).slices;
  for (std::size_t k = 0; k < slices.size(); ++k) {
    if (frozen_.frozen(s, k)) continue;
    const ParamSlice& slice = slices[k];
    kernels::AdamSubgroup sub;
    sub.grad = grads_[s][k];
    sub.param = reinterpret_cast<float*>(slice.device_ptr);
    sub.exp_avg = static_cast<char*>(state_.exp_avg(s)) + slice.offset * mb;
    sub.exp_avg_sq = static_cast<char*>(state_.exp_avg_sq(s)) + slice.offset * mb;
    sub.count = slice.count;
    sub.grad_dtype = state_.options().grad_dtype;
    sub.state_dtype = state_.options().state_dtype;
    // Stochastic rounding hashes each element's index in the flat state: the slice's own.
    sub.moment_rounding = state_.moment_rounding();
    sub.rounding_index = state_.first_index(s) + slice.offset;
    nonfinite += kernels::cpu_adam_step(sub, hyper, options).nonfinite;
  }
  return nonfinite;
}

namespace {

// The part of `slice` within `range`: its first element (of the subgroup), how many, and how far
// into the slice it starts. Empty (count 0) when they do not meet.
struct Overlap {
  std::uint64_t first = 0, count = 0, into = 0;
};
Overlap overlap(const ParamSlice& slice, ModelParams::Range range) {
  const std::uint64_t begin = std::max(slice.offset, range.first);
  const std::uint64_t end = std::min(slice.offset + slice.count, range.first + range.count);
  if (begin >= end) return {};
  return {begin, end - begin, begin - slice.offset};
}

}  // namespace

void HostParams::copy_weights_in(std::size_t s, CUdeviceptr to, Range range,
                                 const driver::Stream& stream) const {
  for (const ParamSlice& slice : state_.spec(s).slices) {
    const Overlap o = overlap(slice, range);
    if (o.count == 0) continue;
    driver::copy_to_device_async(to + o.first * 4,
                                 reinterpret_cast<const float*>(slice.device_ptr) + o.into,
                                 o.count * 4, stream);
  }
}

void HostParams::copy_gradient_in(std::size_t s, CUdeviceptr to, Range range,
                                  const driver::Stream& stream) const {
  const unsigned gs = state_.grad_bytes();
  const std::vector<ParamSlice>& slices = state_.spec(s).slices;
  for (std::size_t k = 0; k < slices.size(); ++k) {
    const Overlap o = overlap(slices[k], range);
    if (o.count == 0) continue;
    const void* g = grads_[s][k];
    if (frozen_.frozen(s, k) || g == nullptr) {
      driver::fill_zero_async(to + o.first * gs, o.count * gs, stream);
    } else {
      driver::copy_to_device_async(to + o.first * gs, static_cast<const char*>(g) + o.into * gs,
                                   o.count * gs, stream);
    }
  }
}

void* HostParams::take_staging(std::size_t s) { return state_.arena().allocate(staging_bytes(s)); }

void HostParams::give_staging(std::size_t s, void* staging) {
  if (staging != nullptr) state_.arena().deallocate(staging, staging_bytes(s));
}

bool HostParams::write_committed(std::size_t s, CUdeviceptr, const void* staging,
                                 const driver::Stream&) const {
  const auto* weights = static_cast<const float*>(staging);
  const std::vector<ParamSlice>& slices = state_.spec(s).slices;
  for (std::size_t k = 0; k < slices.size(); ++k) {
    if (frozen_.frozen(s, k)) continue;
    std::memcpy(reinterpret_cast<void*>(slices[k].device_ptr), weights + slices[k].offset,
                slices[k].count * 4);
  }
  return false;
}

}  // namespace tide::runtime
