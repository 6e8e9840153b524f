#include "interpose/preload_api.h"

#include <unistd.h>

#include <string>

#include "interpose/interposer.h"

#define TIDE_EXPORT extern "C" __attribute__((visibility("default")))

using tide::interpose::Interposer;

TIDE_EXPORT int tide_interpose_read_stats(int device, tide_interpose_stats* out) {
  Interposer* ip = Interposer::instance_if_started();
  if (out == nullptr || ip == nullptr) return -1;
  const auto memory = ip->telemetry().device_memory(device);
  const auto totals = ip->totals();
  *out = {};
  out->live_bytes = memory.live_bytes;
  out->peak_bytes = memory.peak_bytes;
  for (std::size_t p = 0; p < tide::interpose::kPhaseCount && p < 4; ++p) {
    out->phase_peak_bytes[p] = memory.phase_peak_bytes[p];
  }
  out->allocations = totals.allocations;
  out->frees = totals.frees;
  out->limit_bytes = ip->limit().limit();
  out->limit_used_bytes = ip->limit().used(device);
  out->limit_rejections = totals.limit_rejections;
  out->runtime_allocations = totals.runtime_allocations;
  out->runtime_fallback_records = totals.runtime_fallback_records;
  return 0;
}

TIDE_EXPORT int tide_interpose_mark_phase(const char* phase) {
  if (phase == nullptr) return -1;
  const auto p = tide::interpose::phase_from_name(phase);
  if (p == tide::interpose::Phase::count) return -1;
  Interposer::get().telemetry().mark_phase(p);
  return 0;
}

TIDE_EXPORT int tide_interpose_write_report(const char* path) {
  if (path == nullptr) return -1;
  std::string error;
  if (Interposer::get().write_report(path, &error)) return 0;
  const std::string message = "tide preload: could not write the report: " + error + "\n";
  const ssize_t ignored = write(STDERR_FILENO, message.data(), message.size());
  (void)ignored;
  return -1;
}
