// Gradient offload during the backward pass: as each parameter's gradient is ready, the Python
// layer hands it over here, and it is copied to its subgroup's pinned gradient buffer (or, for a
// subgroup the coming plan updates on the GPU with its gradient kept there, to that subgroup's
// device gradient buffer) on a side stream. Nothing here blocks the caller: the side stream waits
// for the producing stream by event, the copy is asynchronous, and the update phase waits for a
// subgroup's copies by event (GPU pipeline) or on its event from the host (CPU update). The one
// exception: a pageable subgroup's gradients (optimizer_state.h) are copied synchronously, the
// call returning once its copy is done.
//
// The gradient's device memory must stay untouched until the copy is done: PyTorch callers mark
// the gradient tensor with record_stream() on stream() (an ExternalStream), so its caching
// allocator does not hand the memory out again before the side stream has read it.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "driver/stream.h"
#include "kernels/dtype.h"
#include "runtime/optimizer_state.h"

namespace tide::runtime {

class GradientOffload {
 public:
  // The copies run on `stream`, which must outlive this object and every tensor marked with
  // record_stream on it (a pooled stream: driver/stream_pool.h). The driver context must be
  // current on the constructing thread and on every caller.
  GradientOffload(const OptimizerState& state, const driver::Stream& stream);

  // Enqueues the copy of `count` gradient elements of `dtype` (the state's gradient dtype) at
  // `src`, produced on `producer` (0: the legacy default stream), into elements
  // [offset, offset + count) of subgroup `subgroup`. Returns at once. Thread-safe.
  void offload(std::size_t subgroup, std::uint64_t offset, CUdeviceptr src, std::uint64_t count,
               kernels::Dtype dtype, CUstream producer);

  // Where each subgroup's gradient goes: `device[i]` non-zero sends subgroup i's gradients to
  // that device buffer (params(i) elements) instead of its pinned buffer, and also to the pinned
  // buffer where `mirrored[i]` is set (a step that waited for them can then redo the subgroup on
  // the CPU whatever happens to the device). Empty: all to host.
  void route(std::vector<CUdeviceptr> device, std::vector<char> mirrored = {});
  CUdeviceptr device_gradient(std::size_t subgroup) const;
  // The device buffer of a subgroup whose gradients reach it and not its pinned buffer (routed,
  // not mirrored); 0 where the pinned buffer has them.
  CUdeviceptr device_only_gradient(std::size_t subgroup) const;
  // Device buffers that no gradient has reached since they were routed, from the last subgroup
  // down until they add up to `bytes` (or all of them): their subgroups' gradients go to their
  // pinned buffers from now on, and the caller may free the buffers returned. Atomic against
  // offload(): a gradient lands in a buffer returned here only if it was offloaded before.
  struct Withdrawn {
    std::size_t subgroup = 0;
    CUdeviceptr buffer = 0;
  };
  std::vector<Withdrawn> withdraw_unwritten(std::uint64_t bytes);

  // Work submitted to `stream` after this waits for every gradient of `subgroup` offloaded so
  // far.
  void wait_on(std::size_t subgroup, const driver::Stream& stream) const;
  // The host waits for every gradient of `subgroup` offloaded so far.
  void synchronize(std::size_t subgroup) const;
  void synchronize_all() const;

  const driver::Stream& stream() const { return stream_; }
  std::uint64_t offloads() const;

 private:
  const OptimizerState& state_;
  const driver::Stream& stream_;
  mutable std::mutex mutex_;
  driver::Event produced_;             // re-recorded per call; the wait captures it at once
  std::vector<driver::Event> copied_;  // per subgroup: its latest copy on stream_
  std::vector<CUdeviceptr> route_;
  std::vector<char> mirrored_;  // per subgroup when route_ is not empty
  std::vector<char> written_;   // per subgroup: a gradient reached its route since route()
  std::uint64_t offloads_ = 0;
};

}  // namespace tide::runtime
