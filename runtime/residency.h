// Resident state: subgroups whose state slot (master weights and moments, the host slot's layout,
// runtime/optimizer_state.h) lives in device memory across update phases. A resident subgroup is
// updated in place there: no copy over the link, and none on the device.
//
// In place is as atomic as the pinned spares' commit point where it matters: everything that can
// fail and leave the device usable (an allocation, a copy or launch refused when enqueued) fails
// before the kernel is enqueued, so the slot is untouched and the subgroup is completed on the
// CPU; once the kernel is enqueued the update happens, unless the device fails, and a failed
// device's errors are sticky: its memory, whatever it held, is lost with it.
//
// Its pinned slot is then a mirror. Invariant, per subgroup: the state is current in the pinned
// slot, in the device slot, or in both; a subgroup without a device slot is current in the pinned
// slot. Readers of the state between steps (opt.state, state_dict, checkpoints) make the mirror
// current first (to_host), after which what they write there is the state (the device slot is
// then stale, and the next update copies the state in from the pinned slot).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "driver/stream.h"
#include "runtime/optimizer_state.h"
#include "runtime/update_buffer.h"

namespace tide::runtime {

class Residency {
 public:
  explicit Residency(const OptimizerState& state);

  bool resident(std::size_t s) const { return slots_.at(s).device.get() != 0; }
  // The state is current in the pinned slot / in the device slot.
  bool host_current(std::size_t s) const { return slots_.at(s).host_current; }
  bool device_current(std::size_t s) const { return resident(s) && slots_.at(s).device_current; }
  CUdeviceptr device_slot(std::size_t s) const { return slots_.at(s).device.get(); }
  std::vector<char> flags() const;  // by subgroup: resident
  std::size_t count() const;
  std::uint64_t bytes() const;  // device slots held

  // Subgroup s gets a device slot (of at least its slot's bytes), not yet current: its state is
  // copied in from the pinned slot before its first update there.
  void attach(std::size_t s, UpdateBuffer slot);
  // Subgroup s was updated in its device slot: current there only.
  void updated_on_device(std::size_t s);
  // Copies subgroup s's device slot into its pinned slot (synchronously, on `stream`) when the
  // pinned slot is not current. Throws CudaError when the device fails (nothing changed).
  void to_host(std::size_t s, const driver::Stream& stream);
  // The same copy, only enqueued: false when the pinned slot is current already (nothing to
  // send). The pinned slot is the state once the caller has seen the copy done and said so
  // (arrived); until then nothing may read it. Throws CudaError when refused (nothing changed).
  bool send_home(std::size_t s, const driver::Stream& stream);
  // The copy send_home enqueued for subgroup s is done: its pinned slot is current, and its
  // device slot is freed.
  void arrived(std::size_t s);
  // The pinned slot was (or may have been) written: it is the state, the device slot is stale.
  void host_written(std::size_t s);
  // Frees subgroup s's device slot; its pinned slot must be current (std::logic_error if not).
  void drop(std::size_t s);
  // Hands subgroup s's device slot over (for a quarantine), leaving s without one; its pinned
  // slot must be current.
  UpdateBuffer take_slot(std::size_t s);
  // Forgets every device slot without freeing it (queued work that could not be waited for may
  // still use them).
  void leak() noexcept;

 private:
  struct Slot {
    UpdateBuffer device;
    bool host_current = true;
    bool device_current = false;
  };
  const OptimizerState& state_;
  std::vector<Slot> slots_;
};

}  // namespace tide::runtime
