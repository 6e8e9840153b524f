// Where the model's parameters live, and so how an update phase reads a subgroup's gradient and
// weights and how its new weights reach the model:
// - on the device (runtime/device_params.h): the master weights are in the state slot, the
//   gradients are offloaded into pinned buffers during backward, and new weights are written into
//   the model's device parameters (from the GPU buffer, or uploaded after a CPU update);
// - in host memory (runtime/host_params.h; FSDP2's CPUOffloadPolicy): the fp32 parameters are
//   their own master weights, the gradients are read where they are, a CPU update writes the
//   parameters in place, and a GPU update stages its new weights in pinned memory until its
//   commit copies them into the parameters (a host memcpy, which cannot fail).
// The executor's phase is written once against this interface.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "driver/stream.h"
#include "kernels/adam_math.h"
#include "kernels/cpu_adam.h"
#include "runtime/gradient_stats.h"

namespace tide::runtime {

class ModelParams {
 public:
  virtual ~ModelParams() = default;

  // Gradients given for the coming step, per slice (host-resident parameters only; the others'
  // gradients are offloaded). Null: none (the slice must then be frozen).
  virtual void set_gradient(std::size_t subgroup, std::size_t slice, const void* grad) = 0;
  virtual const void* gradient(std::size_t subgroup, std::size_t slice) const = 0;
  // Throws std::invalid_argument for a slice neither frozen nor given a gradient.
  virtual void check_gradients() const = 0;
  // Statistics of the gradients the coming step reads (waits for the offloads).
  virtual GradientStats gradient_stats(const GradientOffload& offload) const = 0;
  // After a step: the given gradients are the caller's memory, none is read again.
  virtual void forget_gradients() = 0;

  // Updates subgroup s on the CPU; returns the elements left unchanged (non-finite).
  virtual std::uint64_t cpu_update(std::size_t s, const kernels::AdamHyper& hyper,
                                   const kernels::CpuAdamOptions& options) const = 0;
  // Whether a CPU update writes the model's parameters itself (else upload() must follow it).
  virtual bool updated_in_place() const = 0;
  // Enqueues the upload of subgroup s's new weights after its CPU update.
  virtual void upload(std::size_t s, const driver::Stream& stream) const = 0;
  // Writes the model's parameters of subgroup s from its committed state, now. Throws CudaError.
  virtual void write(std::size_t s) const = 0;
  // Whether write(s) needs no device: the parameters are host memory the CPU writes (host-
  // resident, or the stand-in's CPU mode), so a lost device does not keep them from the state.
  virtual bool writes_without_device(std::size_t s) const = 0;

  // Bytes per parameter a GPU buffer holds for the weights besides the state slot.
  virtual unsigned weight_bytes_in_buffer() const = 0;
  // The elements [first, first + count) of subgroup s: one chunk of a GPU subgroup's copies.
  struct Range {
    std::uint64_t first = 0;
    std::uint64_t count = 0;
  };
  // Enqueues the copy of subgroup s's weights of `range` into a GPU buffer whose element 0 is at
  // `to` (none when they are in the state slot).
  virtual void copy_weights_in(std::size_t s, CUdeviceptr to, Range range,
                               const driver::Stream& stream) const = 0;
  // Enqueues the copy of subgroup s's gradient of `range` into a GPU buffer whose element 0 is
  // at `to`.
  virtual void copy_gradient_in(std::size_t s, CUdeviceptr to, Range range,
                                const driver::Stream& stream) const = 0;
  // Pinned memory the copy-out writes subgroup s's new weights into (null: none needed, they are
  // written from the GPU buffer); of staging_bytes(s). Throws std::bad_alloc.
  virtual void* take_staging(std::size_t s) = 0;
  virtual void give_staging(std::size_t s, void* staging) = 0;
  virtual std::size_t staging_bytes(std::size_t s) const = 0;
  // Writes committed subgroup s's new weights into the model's parameters: from `staging` now
  // (returns false), or enqueued on `stream` from the GPU buffer at `weights` (returns true).
  // Throws CudaError when they cannot be enqueued.
  virtual bool write_committed(std::size_t s, CUdeviceptr weights, const void* staging,
                               const driver::Stream& stream) const = 0;
  // Whether an update kernel may write subgroup s's new weights straight into the model's
  // parameters (device memory of the weights' dtype, no slice frozen): a resident update then
  // needs no area for them and no copy after it.
  virtual bool kernel_writes(std::size_t s) const = 0;
};

}  // namespace tide::runtime
