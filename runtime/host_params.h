// The model's parameters in host memory (runtime/model_params.h; FSDP2's CPUOffloadPolicy, whose
// sharded fp32 parameters and gradients are pinned already): the parameters are their own master
// weights (the state slot holds the moments only) and each step's gradients are read where they
// are, slice by slice. A CPU update writes the parameters in place; a GPU update copies them in
// with the moments and stages its new weights in pinned memory until its commit copies them into
// the parameters, so the parameters change only at a commit or in a CPU update, which cannot
// fail: no subgroup is ever left unwritten.
#pragma once

#include <vector>

#include "runtime/frozen_slices.h"
#include "runtime/model_params.h"
#include "runtime/optimizer_state.h"

namespace tide::runtime {

class HostParams final : public ModelParams {
 public:
  HostParams(OptimizerState& state, const FrozenSlices& frozen);

  void set_gradient(std::size_t subgroup, std::size_t slice, const void* grad) override {
    grads_.at(subgroup).at(slice) = grad;
  }
  const void* gradient(std::size_t subgroup, std::size_t slice) const override {
    return grads_.at(subgroup).at(slice);
  }
  void check_gradients() const override;
  GradientStats gradient_stats(const GradientOffload& offload) const override;
  void forget_gradients() override;

  std::uint64_t cpu_update(std::size_t s, const kernels::AdamHyper& hyper,
                           const kernels::CpuAdamOptions& options) const override;
  bool updated_in_place() const override { return true; }
  void upload(std::size_t, const driver::Stream&) const override {}
  void write(std::size_t) const override {}
  bool writes_without_device(std::size_t) const override { return true; }

  // The fp32 parameters, after the slot's moments.
  unsigned weight_bytes_in_buffer() const override { return 4; }
  bool kernel_writes(std::size_t) const override { return false; }  // host memory
  void copy_weights_in(std::size_t s, CUdeviceptr to, Range range,
                       const driver::Stream& stream) const override;
  // A frozen slice (or one without a gradient) gets zeros: its update is undone.
  void copy_gradient_in(std::size_t s, CUdeviceptr to, Range range,
                        const driver::Stream& stream) const override;
  void* take_staging(std::size_t s) override;
  void give_staging(std::size_t s, void* staging) override;
  std::size_t staging_bytes(std::size_t s) const override { return 4 * state_.params(s); }
  bool write_committed(std::size_t s, CUdeviceptr weights, const void* staging,
                       const driver::Stream& stream) const override;

 private:
  OptimizerState& state_;
  const FrozenSlices& frozen_;
  std::vector<std::vector<const void*>> grads_;  // per subgroup, per slice
};

}  // namespace tide::runtime
