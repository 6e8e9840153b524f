// The interposer's telemetry: the allocator's (allocator/telemetry/) fed with what the driver
// hooks see, so that an unmodified trainer gets the same timeline, iterations and phases
// (marked, or detected from the curve), per-phase peaks, headroom forecast and Perfetto trace as
// a trainer using tide's allocator.
//
// At the driver level there is no difference between live and reserved bytes: both are the
// device memory the process holds (a framework's own cache is inside it). Times are EventClock
// ticks while recording, converted to nanoseconds when the report is written.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "allocator/telemetry/headroom.h"
#include "allocator/telemetry/oom_record.h"
#include "allocator/telemetry/telemetry.h"
#include "interpose/event_clock.h"
#include "interpose/memory_events.h"
#include "interpose/spin_lock.h"

namespace tide::interpose {

class AllocatorTelemetry final : public MemoryTelemetry {
 public:
  // `limit_bytes`: TIDE_MEMORY_LIMIT (0: none), the ceiling of the headroom forecast.
  explicit AllocatorTelemetry(std::uint64_t limit_bytes);

  void on_alloc(const MemoryEvent& event) override;
  void on_free(const MemoryEvent& event) override;
  void on_refused(const MemoryEvent& event) override;
  void mark_phase(Phase phase) override;
  void note_device_total(int device, std::uint64_t total_bytes) override;

  DeviceMemory device_memory(int device) const override;
  int devices_seen() const override;

  std::string report_json() const override;
  bool write_trace(const std::string& path, std::vector<std::string>* written,
                   std::string* error) const override;

  void prepare_fork() override;
  void parent_after_fork() override;
  void child_after_fork() override;

  static constexpr std::size_t kSamplesPerDevice = std::size_t{1} << 18;
  static constexpr std::size_t kRefusalsKept = 1024;

 private:
  struct Device {
    mutable SpinLock lock;
    std::atomic<bool> ready{false};  // `telemetry` exists
    std::unique_ptr<allocator::telemetry::Telemetry>
        telemetry;  // created on the device's first event
    DeviceMemory memory;
    Phase phase = Phase::unmarked;  // the last phase marked on this device's telemetry
    // The iteration in progress, as the allocator's telemetry tracks it (it keeps it private
    // until its end mark): the report shows it too.
    allocator::telemetry::IterationStats open{};
    std::uint64_t iterations_closed = 0;
    std::vector<allocator::telemetry::OomRecord> refusals;
    std::atomic<std::uint64_t> total{0};  // device memory as the driver reported it
  };
  // What the report and the trace need of one device, times in nanoseconds.
  struct Snapshot {
    std::vector<allocator::telemetry::Sample> samples;
    std::vector<allocator::telemetry::MarkEvent> marks;
    std::vector<allocator::telemetry::IterationStats> iterations;  // marked, else detected
    std::vector<allocator::telemetry::OomRecord> refusals;
    allocator::telemetry::HeadroomForecast headroom;
    DeviceMemory memory;
    std::uint64_t samples_dropped = 0;
    bool detected = false;
  };

  Device& device(int index);  // creates the telemetry on first use
  // Runs change(device, phase) on the event's device under its lock, the current phase marked
  // there first, then records the device's live bytes in its timeline.
  template <typename Change>
  void apply(const MemoryEvent& event, Change&& change);
  void mark_locked(Device& d, Phase phase, std::uint64_t now);
  Snapshot snapshot(int index, double ns_per_tick) const;

  const std::uint64_t limit_;
  EventClock clock_;
  std::array<Device, kMaxDevices> devices_;
  std::atomic<int> devices_seen_{0};
  std::atomic<Phase> phase_{Phase::unmarked};
  SpinLock create_lock_;
};

}  // namespace tide::interpose
