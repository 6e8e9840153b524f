#include "runtime/gradient_offload.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "driver/memory.h"

namespace tide::runtime {

GradientOffload::GradientOffload(const OptimizerState& state, const driver::Stream& stream)
    : state_(state), stream_(stream), copied_(state.size()), written_(state.size(), 0) {}

void GradientOffload::offload(std::size_t subgroup, std::uint64_t offset, CUdeviceptr src,
                              std::uint64_t count, kernels::Dtype dtype, CUstream producer) {
  const std::string where = "tide: gradient offload to subgroup " + std::to_string(subgroup);
  if (subgroup >= state_.size()) {
    throw std::invalid_argument(where + ": there are " + std::to_string(state_.size()) +
                                " subgroups");
  }
  if (state_.host_params()) {
    throw std::invalid_argument(where +
                                ": host-resident parameters read their gradients where "
                                "they are (tide_optimizer_set_gradients), nothing is offloaded");
  }
  if (dtype != state_.options().grad_dtype) {
    throw std::invalid_argument(where + ": the gradient's dtype is not the state's gradient dtype");
  }
  const std::uint64_t n = state_.params(subgroup);
  if (count == 0 || offset > n || count > n - offset) {
    throw std::invalid_argument(where + ": elements [" + std::to_string(offset) + ", " +
                                std::to_string(offset + count) + ") are outside its " +
                                std::to_string(n) + " parameters");
  }
  const unsigned size = state_.grad_bytes();
  if (src == 0 || src % size != 0) {
    throw std::invalid_argument(where + ": null or misaligned gradient pointer");
  }
  const std::uint64_t bytes = count * size;
  std::unique_lock lock(mutex_);
  produced_.record(producer);
  stream_.wait(produced_);
  const CUdeviceptr device = route_.empty() ? 0 : route_[subgroup];
  if (device != 0) driver::copy_on_device_async(device + offset * size, src, bytes, stream_);
  if (device == 0 || mirrored_[subgroup] != 0) {
    driver::copy_to_host_async(static_cast<char*>(state_.grad(subgroup)) + offset * size, src,
                               bytes, stream_);
  }
  copied_[subgroup].record(stream_);
  written_[subgroup] = 1;
  ++offloads_;
  if (device == 0 && state_.pageable(subgroup)) {
    // Pageable subgroups (optimizer_state.h) are offloaded synchronously: CUDA stages a copy
    // into pageable memory itself and does not overlap it with the caller, so waiting for its
    // event says plainly what happens, for every driver. It costs the caller the producer's
    // queued work and this copy, for pageable subgroups only; no pinned bounce buffer is taken
    // from a share that is already full.
    const driver::Event& done = copied_[subgroup];
    lock.unlock();
    done.synchronize();
  }
}

void GradientOffload::route(std::vector<CUdeviceptr> device, std::vector<char> mirrored) {
  if (!device.empty() && device.size() != state_.size()) {
    throw std::invalid_argument("tide: gradient offload: one route per subgroup");
  }
  if (!mirrored.empty() && mirrored.size() != device.size()) {
    throw std::invalid_argument("tide: gradient offload: one mirror flag per route");
  }
  if (mirrored.empty()) mirrored.assign(device.size(), 0);
  std::lock_guard lock(mutex_);
  route_ = std::move(device);
  mirrored_ = std::move(mirrored);
  std::fill(written_.begin(), written_.end(), 0);
}

std::vector<GradientOffload::Withdrawn> GradientOffload::withdraw_unwritten(std::uint64_t bytes) {
  std::vector<Withdrawn> out;
  std::lock_guard lock(mutex_);
  std::uint64_t freed = 0;
  for (std::size_t s = route_.size(); s-- > 0 && freed < bytes;) {
    if (route_[s] == 0 || written_[s] != 0) continue;
    out.push_back({s, route_[s]});
    route_[s] = 0;
    freed += state_.params(s) * state_.grad_bytes();
  }
  return out;
}

CUdeviceptr GradientOffload::device_gradient(std::size_t subgroup) const {
  std::lock_guard lock(mutex_);
  return route_.empty() ? 0 : route_.at(subgroup);
}

CUdeviceptr GradientOffload::device_only_gradient(std::size_t subgroup) const {
  std::lock_guard lock(mutex_);
  return route_.empty() || mirrored_.at(subgroup) != 0 ? 0 : route_.at(subgroup);
}

void GradientOffload::wait_on(std::size_t subgroup, const driver::Stream& stream) const {
  std::lock_guard lock(mutex_);
  stream.wait(copied_.at(subgroup));
}

void GradientOffload::synchronize(std::size_t subgroup) const {
  // An event never recorded is complete, so a subgroup without offloads does not wait. The
  // event is not re-recorded while the update phase runs (backward is over).
  const driver::Event* event;
  {
    std::lock_guard lock(mutex_);
    event = &copied_.at(subgroup);
  }
  event->synchronize();
}

void GradientOffload::synchronize_all() const {
  for (std::size_t i = 0; i < copied_.size(); ++i) synchronize(i);
}

std::uint64_t GradientOffload::offloads() const {
  std::lock_guard lock(mutex_);
  return offloads_;
}

}  // namespace tide::runtime
