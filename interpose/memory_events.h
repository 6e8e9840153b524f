// What the interposer tells tide's memory telemetry, and what it asks back for its report.
//
// The interposer sees device allocations and releases; the telemetry turns them into a timeline,
// iterations and phases, per-phase peaks and a headroom forecast. The implementation is the
// allocator's telemetry behind an adapter (interpose/allocator_telemetry.h), chosen in
// make_telemetry() (interposer.cpp); the hooks know only this interface.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "interpose/entry_points.h"

namespace tide::interpose {

// The phases of a training iteration (docs/design/index.md's vocabulary); `unmarked` before any
// mark.
enum class Phase : std::uint8_t { unmarked, forward, backward, update, count };

inline constexpr std::size_t kPhaseCount = static_cast<std::size_t>(Phase::count);
inline constexpr int kMaxDevices = 64;

std::string_view phase_name(Phase phase);
// "forward", "backward" or "update"; nullopt-like Phase::count for anything else.
Phase phase_from_name(std::string_view name);

struct MemoryEvent {
  std::uint64_t address = 0;  // device pointer, or the handle of a cuMemCreate allocation
  std::uint64_t bytes = 0;
  int device = 0;             // 0 .. kMaxDevices-1
  CUstream stream = nullptr;  // the stream of a stream-ordered call, else null
  Kind api = Kind::count;     // the entry point (the runtime call above it, when there was one)
  std::uint32_t site = 0;     // interned call stack (CallStacks), 0 when none was captured
};

struct DeviceMemory {
  std::uint64_t live_bytes = 0;
  std::uint64_t peak_bytes = 0;
  std::uint64_t phase_peak_bytes[kPhaseCount] = {};
};

class MemoryTelemetry {
 public:
  virtual ~MemoryTelemetry() = default;

  // Events, in the order the hooks saw them; called concurrently from any thread.
  virtual void on_alloc(const MemoryEvent& event) = 0;
  virtual void on_free(const MemoryEvent& event) = 0;
  // An allocation the memory limit refused (the driver was not asked).
  virtual void on_refused(const MemoryEvent& event) = 0;
  virtual void mark_phase(Phase phase) = 0;
  // The device's memory as the driver reported it (cuMemGetInfo, cuDeviceTotalMem).
  virtual void note_device_total(int device, std::uint64_t total_bytes) = 0;

  virtual DeviceMemory device_memory(int device) const = 0;
  virtual int devices_seen() const = 0;  // one past the highest device with an event

  // The report's "telemetry" object (JSON), and the timeline as Perfetto-loadable traces (Chrome
  // JSON trace format) at `path` (one device) or next to it (one file per device), listed in
  // `written`; a trace is written only over nothing or a trace (io/safe_file.h).
  virtual std::string report_json() const = 0;
  virtual bool write_trace(const std::string& path, std::vector<std::string>* written,
                           std::string* error) const = 0;

  // fork(): the parent holds every lock across it; the child starts empty (the parent's device
  // memory is not the child's).
  virtual void prepare_fork() = 0;
  virtual void parent_after_fork() = 0;
  virtual void child_after_fork() = 0;
};

}  // namespace tide::interpose
