// The model's parameters on the device (runtime/model_params.h): the master weights are the
// state's, the gradients are offloaded into pinned buffers, new weights are written into the
// model's device parameters, frozen slices never.
#pragma once

#include <vector>

#include "driver/context.h"
#include "runtime/frozen_slices.h"
#include "runtime/model_params.h"
#include "runtime/optimizer_state.h"

namespace tide::runtime {

class DeviceParams final : public ModelParams {
 public:
  // `cpu_threads`: of the cast write() makes (0: the whole pool).
  // Needs the device's context current (it asks the driver where each slice is).
  DeviceParams(OptimizerState& state, const FrozenSlices& frozen,
               const driver::PrimaryContext& context, unsigned cpu_threads);

  void set_gradient(std::size_t subgroup, std::size_t slice, const void* grad) override;
  const void* gradient(std::size_t, std::size_t) const override { return nullptr; }
  void check_gradients() const override {}
  GradientStats gradient_stats(const GradientOffload& offload) const override;
  void forget_gradients() override {}

  std::uint64_t cpu_update(std::size_t s, const kernels::AdamHyper& hyper,
                           const kernels::CpuAdamOptions& options) const override;
  bool updated_in_place() const override { return false; }
  void upload(std::size_t s, const driver::Stream& stream) const override;
  void write(std::size_t s) const override;
  bool writes_without_device(std::size_t s) const override { return host_[s] != 0; }

  unsigned weight_bytes_in_buffer() const override { return 0; }
  void copy_weights_in(std::size_t, CUdeviceptr, Range, const driver::Stream&) const override {}
  void copy_gradient_in(std::size_t s, CUdeviceptr to, Range range,
                        const driver::Stream& stream) const override;
  void* take_staging(std::size_t) override { return nullptr; }
  void give_staging(std::size_t, void*) override {}
  std::size_t staging_bytes(std::size_t) const override { return 0; }
  bool write_committed(std::size_t s, CUdeviceptr weights, const void* staging,
                       const driver::Stream& stream) const override;
  bool kernel_writes(std::size_t s) const override { return host_[s] == 0 && !frozen_.any(s); }

 private:
  OptimizerState& state_;
  const FrozenSlices& frozen_;
  const driver::PrimaryContext& context_;
  unsigned cpu_threads_;
  // Per subgroup: every slice is host memory the CPU writes (driver::host_addressable).
  std::vector<char> host_;
};

}  // namespace tide::runtime
