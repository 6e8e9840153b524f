// The update phase's GPU memory between phases. Buffers are kept from one phase to the next
// (allocating them every phase costs driver calls without tide's allocator, and cuMemFree
// synchronises on a real GPU). After a phase whose streams could not be waited for (a lost
// device), everything its queued work may still write is quarantined: buffers, spare state slots,
// pinned counters and staging areas are neither reused nor freed until that work is known done.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "allocator/device/headroom_resource.h"
#include "allocator/memory_resource.h"
#include "runtime/optimizer_state.h"
#include "runtime/update_buffer.h"

namespace tide::runtime {

class BufferPool {
 public:
  // `memory`: where buffers come from; null: tide's caching allocator of `device` when the
  // process uses it (its headroom), else the driver (cuMemAlloc).
  BufferPool(int device, allocator::DeviceMemoryResource* memory);

  // The resource buffers come from. tide's allocator is looked up at every call until found:
  // PyTorch creates it at its first allocation on the device, which may come after the optimizer.
  allocator::DeviceMemoryResource& memory();
  // tide's caching allocator the buffers come from (found, or given as its HeadroomResource);
  // null when they come from elsewhere.
  allocator::device::CachingAllocator* caching_allocator();

  // Up to `count` kept buffers of at least `bytes` each; the others stay kept.
  std::vector<UpdateBuffer> take(std::uint64_t bytes, std::size_t count);
  // The kept counters if they have at least `bytes`, else none; the pool keeps none after.
  UpdateBuffer take_counters(std::uint64_t bytes);
  // After a phase without fault: keeps `used`, then the buffers kept before as far as they fit in
  // `headroom` together (a plan that alternates between fewer and more buffers does not allocate
  // them again each time; one that shrank with the headroom holds no more than it); frees the rest.
  void keep(std::vector<UpdateBuffer> used, UpdateBuffer counters, std::uint64_t headroom);
  // Frees every kept buffer and the counters.
  void clear();

  // What of `headroom` may be held through a whole iteration: gradients kept on the GPU from
  // zero_grad() on must leave room for the forward and backward passes. With tide's allocator, no
  // more than its forecast's held headroom once it has seen an iteration (a headroom measured in
  // another memory state, or for the update phase alone, would leave the forward pass none);
  // otherwise `headroom`.
  std::uint64_t holdable(std::uint64_t headroom);
  // What of `headroom` resident state may hold across iterations: as holdable(), but nothing
  // before tide's allocator has seen an iteration, nor without tide's allocator or a given
  // resource (the forward pass's peak is unknown there, and nothing could give the memory back).
  std::uint64_t residency_budget(std::uint64_t headroom);
  // The update phase's own headroom as tide's allocator forecasts it, once it has seen an
  // iteration; nullopt without tide's allocator (nothing to compare a held plan with).
  std::optional<std::uint64_t> update_headroom();
  // A prepared plan's GPU subgroups' gradients, kept on the GPU (ExecutorOptions::
  // gradients_on_gpu) until the phase that reads them is over.
  CUdeviceptr add_gradient(std::uint64_t bytes, CUstream stream);
  bool has_gradients() const { return !gradients_.empty(); }
  // Frees the kept gradient buffer at `ptr` (one add_gradient gave); returns its bytes (0 if
  // there is none).
  std::uint64_t free_gradient(CUdeviceptr ptr);
  std::uint64_t gradient_bytes() const;
  void clear_gradients() { gradients_.clear(); }

  // Quarantine: `buffers`, `counters`, every kept buffer and gradient, and what the calls below
  // add, until release_quarantine().
  void quarantine(std::vector<UpdateBuffer> buffers, UpdateBuffer counters);
  void quarantine_slot(std::size_t subgroup, float* slot) { slots_.emplace_back(subgroup, slot); }
  void quarantine_pinned(void* p, std::size_t bytes) { pinned_.emplace_back(p, bytes); }
  bool unconfirmed() const { return unconfirmed_; }
  // Once the queued work is known done: the spare slots go back to `state`, pinned memory to its
  // arena, the buffers are freed.
  void release_quarantine(OptimizerState& state);
  // The device cannot be waited for and the pool goes: forgets every buffer without freeing it.
  void leak() noexcept;

 private:
  allocator::DeviceMemoryResource* given_;
  int device_;
  // Before the buffers: they go back to these when they go.
  allocator::DriverResource driver_memory_;
  std::unique_ptr<allocator::device::HeadroomResource> headroom_memory_;
  std::vector<UpdateBuffer> kept_;
  UpdateBuffer counters_;
  std::vector<UpdateBuffer> gradients_;
  bool unconfirmed_ = false;
  std::vector<UpdateBuffer> quarantined_;
  std::vector<std::pair<std::size_t, float*>> slots_;  // (subgroup, spare)
  std::vector<std::pair<void*, std::size_t>> pinned_;  // counters, staging areas
};

}  // namespace tide::runtime
