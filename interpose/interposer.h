// The interposer's process-wide state, created by the first hooked CUDA call.
//
// Until then the preload is inert: no knob is read, no handler installed, no thread started, no
// memory allocated, and nothing is written at exit. A process that never uses CUDA (a shell, a
// compiler, a data-loader worker) runs exactly as without it.
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "interpose/call_stacks.h"
#include "interpose/entry_points.h"
#include "interpose/live_allocations.h"
#include "interpose/memory_events.h"
#include "interpose/memory_limit.h"
#include "interpose/settings.h"
#include "io/json_writer.h"

namespace tide::interpose {

class Interposer {
 public:
  // The state; created on the first call (a bad knob value stops the process with the knob's
  // message, as everywhere in tide). Never destroyed: hooks may run during exit.
  static Interposer& get();
  // The state if a hooked call created it already, else nullptr (and nothing is created).
  static Interposer* instance_if_started();

  const Settings& settings() const { return settings_; }
  MemoryLimit& limit() { return limit_; }
  LiveAllocations& allocations() { return allocations_; }  // by device address
  LiveAllocations& physical() { return physical_; }        // cuMemCreate handles, by handle
  LiveAllocations& mappings() { return mappings_; }        // cuMemMap ranges, by address
  CallStacks& stacks() { return stacks_; }
  MemoryTelemetry& telemetry() { return *telemetry_; }

  // A call through a hook of `kind`: whether it succeeded, and the bytes it asked for.
  void count_call(Kind kind, bool ok, std::uint64_t bytes = 0);
  // An allocation the memory limit refused.
  void count_limit_rejection(Kind origin, std::uint64_t bytes, int device, CUstream stream);
  // Virtual-memory mappings, per device (what cuMemMap/cuMemUnmap changed).
  void count_mapping(int device, std::int64_t delta_bytes);

  // A successful allocation, already counted against the limit. `origin` is the runtime call it
  // came from, or the driver entry point itself.
  void record_alloc(LiveAllocations& table, Kind origin, std::uint64_t key, std::uint64_t bytes,
                    int device, CUstream stream);
  // A release of `key` the caller is about to make: removes and returns its record.
  std::optional<Allocation> take(LiveAllocations& table, std::uint64_t key);
  // ... and, once the driver agreed, gives its bytes back to the limit and the telemetry.
  void record_free(Kind api, const Allocation& allocation, std::uint64_t key, CUstream stream);
  // The driver refused the release: the record goes back.
  void restore(LiveAllocations& table, std::uint64_t key, const Allocation& allocation);

  // Marks the process as one that uses CUDA: it writes a report at exit.
  void note_used();

  // Writes the report (and the trace next to it) to `path`: over nothing, or over a report (and
  // traces) tide wrote before; never over another file, into a FIFO or device, or creating folders.
  bool write_report(const std::string& path, std::string* error);
  // The report at exit or on a fatal signal: once per process.
  void write_final_report();

  struct Totals {
    std::uint64_t allocations = 0;
    std::uint64_t frees = 0;
    std::uint64_t limit_rejections = 0;
    std::uint64_t runtime_allocations = 0;
    std::uint64_t runtime_fallback_records = 0;
  };
  Totals totals() const;
  void count_runtime_fallback();

 private:
  Interposer(Settings settings, std::unique_ptr<MemoryTelemetry> telemetry);

  static void prepare_fork();
  static void parent_after_fork();
  static void child_after_fork();

  io::json::Object report() const;
  std::string summary_line(const std::string& report_path) const;
  void start_reporter();

  const Settings settings_;
  MemoryLimit limit_;
  LiveAllocations allocations_;
  LiveAllocations physical_;
  LiveAllocations mappings_;
  CallStacks stacks_;
  std::unique_ptr<MemoryTelemetry> telemetry_;
  std::uint64_t start_ns_;
  std::array<std::atomic<std::int64_t>, kMaxDevices> mapped_{};
  std::array<std::atomic<std::int64_t>, kMaxDevices> mapped_peak_{};

  std::atomic<bool> used_{false};
  std::atomic<bool> reported_{false};
  std::atomic<long> reporter_pid_{0};
  std::atomic<bool> forked_child_{false};
};

}  // namespace tide::interpose
