#include "runtime/residency.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "driver/memory.h"

namespace tide::runtime {

Residency::Residency(const OptimizerState& state) : state_(state), slots_(state.size()) {}

std::vector<char> Residency::flags() const {
  std::vector<char> f(slots_.size(), 0);
  for (std::size_t s = 0; s < slots_.size(); ++s) f[s] = resident(s) ? 1 : 0;
  return f;
}

std::size_t Residency::count() const {
  return static_cast<std::size_t>(
      std::count_if(slots_.begin(), slots_.end(), [](const Slot& x) { return x.device.get(); }));
}

std::uint64_t Residency::bytes() const {
  std::uint64_t b = 0;
  for (const Slot& x : slots_) b += x.device.size();
  return b;
}

void Residency::attach(std::size_t s, UpdateBuffer slot) {
  Slot& x = slots_.at(s);
  if (x.device.get() != 0) throw std::logic_error("tide: residency: a second device slot");
  if (!x.host_current) throw std::logic_error("tide: residency: the pinned slot is not current");
  x.device = std::move(slot);
  x.device_current = false;
}

void Residency::updated_on_device(std::size_t s) {
  Slot& x = slots_.at(s);
  x.device_current = true;
  x.host_current = false;
}

void Residency::to_host(std::size_t s, const driver::Stream& stream) {
  Slot& x = slots_.at(s);
  if (x.host_current) return;
  driver::copy_to_host_async(state_.slot(s), x.device.get(), state_.slot_bytes(s), stream);
  stream.synchronize();
  x.host_current = true;
}

bool Residency::send_home(std::size_t s, const driver::Stream& stream) {
  Slot& x = slots_.at(s);
  if (x.host_current) return false;
  driver::copy_to_host_async(state_.slot(s), x.device.get(), state_.slot_bytes(s), stream);
  return true;
}

void Residency::arrived(std::size_t s) {
  Slot& x = slots_.at(s);
  if (x.device.get() == 0) throw std::logic_error("tide: residency: nothing was sent home");
  x.host_current = true;
  drop(s);
}

void Residency::host_written(std::size_t s) {
  Slot& x = slots_.at(s);
  if (!x.host_current) throw std::logic_error("tide: residency: the pinned slot is not current");
  x.device_current = false;
}

void Residency::drop(std::size_t s) { (void)take_slot(s); }

UpdateBuffer Residency::take_slot(std::size_t s) {
  Slot& x = slots_.at(s);
  if (!x.host_current) {
    throw std::logic_error("tide: residency: a device slot would go with the only current state");
  }
  x.device_current = false;
  return std::exchange(x.device, UpdateBuffer());
}

void Residency::leak() noexcept {
  for (Slot& x : slots_) x.device.leak();
}

}  // namespace tide::runtime
