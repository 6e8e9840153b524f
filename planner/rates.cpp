#include "planner/rates.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "config/env.h"
#include "planner/units.h"

namespace tide::planner {
namespace {

constexpr double kGB = 1e9;

// Knob and flag ranges: wide enough for any machine, narrow enough to catch a unit mistake
// (params/s given as 2.2 instead of 2.2e9, or bytes/s given where GB/s are expected).
constexpr RateInfo kRates[kRateCount] = {
    {RateKind::cpu_update, &Rates::cpu_update, "cpu_update_params_per_s", "TIDE_RATE_CPU_UPDATE",
     "--cpu-update", "CPU update", "params/s", 1.0, 1e3, 1e15},
    {RateKind::cpu_update_contended, &Rates::cpu_update_contended,
     "cpu_update_contended_params_per_s", "TIDE_RATE_CPU_UPDATE_CONTENDED",
     "--cpu-update-contended", "CPU update while copies run", "params/s", 1.0, 1e3, 1e15},
    {RateKind::h2d, &Rates::h2d, "h2d_bytes_per_s", "TIDE_RATE_H2D_GBPS", "--h2d-gbps",
     "host to GPU copy, alone", "GB/s", kGB, 1e-3, 1e5},
    {RateKind::d2h, &Rates::d2h, "d2h_bytes_per_s", "TIDE_RATE_D2H_GBPS", "--d2h-gbps",
     "GPU to host copy, alone", "GB/s", kGB, 1e-3, 1e5},
    {RateKind::h2d_duplex, &Rates::h2d_duplex, "h2d_duplex_bytes_per_s",
     "TIDE_RATE_H2D_DUPLEX_GBPS", "--h2d-duplex-gbps", "host to GPU copy, both directions", "GB/s",
     kGB, 1e-3, 1e5},
    {RateKind::d2h_duplex, &Rates::d2h_duplex, "d2h_duplex_bytes_per_s",
     "TIDE_RATE_D2H_DUPLEX_GBPS", "--d2h-duplex-gbps", "GPU to host copy, both directions", "GB/s",
     kGB, 1e-3, 1e5},
    {RateKind::gpu_update, &Rates::gpu_update, "gpu_update_params_per_s", "TIDE_RATE_GPU_UPDATE",
     "--gpu-update", "GPU update", "params/s", 1.0, 1e3, 1e15},
    {RateKind::host_memory, &Rates::host_memory, "host_memory_bytes_per_s",
     "TIDE_RATE_HOST_MEMORY_GBPS", "--host-memory-gbps", "host memory, CPU update alone", "GB/s",
     kGB, 1e-3, 1e5, true},
    {RateKind::host_memory_contended, &Rates::host_memory_contended,
     "host_memory_contended_bytes_per_s", "TIDE_RATE_HOST_MEMORY_CONTENDED_GBPS",
     "--host-memory-contended-gbps", "host memory, CPU update and copies", "GB/s", kGB, 1e-3, 1e5,
     true},
};

}  // namespace

std::span<const RateInfo, kRateCount> rate_infos() { return kRates; }

const RateInfo& rate_info(RateKind kind) { return kRates[static_cast<std::size_t>(kind)]; }

Rates builtin_rates() {
  // Per rank of a 4×H100 node (the published setting, docs/design/index.md;
  // tests/planner/published_test.cpp checks the plan they give against the measurements):
  // - CPU update 2.2e9 params/s: the measured all-CPU update phase (5e9 params in 2.27 s, 8.7e9
  //   params/s over 4 ranks). While copies run it shares host memory bandwidth with them: 2.0e9
  //   (10% less).
  // - Copies 25 GB/s each way alone, the top of the quoted 20-25 GB/s of pinned-memory PCIe copies
  //   with four GPUs sharing the host; 23 GB/s each way while both directions run: the measured
  //   K = 2 phase moved 25 subgroups × 1.2 GB each way in 1.30 s, which needs at least that.
  // - GPU update 5e10 params/s: a fused Adam moves ~28 bytes/param through ~3 TB/s of HBM, so
  //   1e11 is the bound; half of it is conservative, and the update is still ~25× faster than
  //   its copies.
  // - Host memory 120 GB/s per rank alone (480 GB/s for the node: two sockets of 8 DDR5-4800
  //   channels, 614 GB/s peak, at the ~80% a STREAM-like pass reaches), 110 GB/s while copies
  //   run in both directions (DMA and CPU traffic interleaved cost row switches). The CPU update
  //   alone takes 2.2e9 × 30 = 66 GB/s of it, the published K = 2 phase ~96 GB/s: the published
  //   setting is not bound by host memory, a host like the H200 one of issue 28 (96 GB/s for the
  //   node) is.
  Rates r;
  r.cpu_update = 2.2e9;
  r.cpu_update_contended = 2.0e9;
  r.h2d = 25e9;
  r.d2h = 25e9;
  r.h2d_duplex = 23e9;
  r.d2h_duplex = 23e9;
  r.gpu_update = 5e10;
  r.host_memory = kBuiltinHostMemory;
  r.host_memory_contended = kBuiltinHostMemoryContended;
  return r;
}

void validate(const Rates& rates, std::string_view origin) {
  for (const RateInfo& info : kRates) {
    const double value = rates.*info.member;
    if (!std::isfinite(value) || value <= 0) {
      throw std::invalid_argument(std::string(origin) + ": rate " + std::string(info.key) +
                                  " must be a finite number > 0, got " + std::to_string(value));
    }
  }
}

std::array<bool, kRateCount> apply_env_overrides(Rates& rates) {
  std::array<bool, kRateCount> overridden{};
  for (const RateInfo& info : kRates) {
    const std::string knob(info.knob);
    if (auto given = config::env_double(knob.c_str(), info.min_given, info.max_given)) {
      rates.*info.member = *given * info.scale;
      overridden[static_cast<std::size_t>(info.kind)] = true;
    }
  }
  return overridden;
}

std::string format_rate(RateKind kind, double value) {
  const RateInfo& info = rate_info(kind);
  if (info.scale == kGB) {
    char buffer[48];
    std::snprintf(buffer, sizeof buffer, "%.1f GB/s", value / kGB);
    return buffer;
  }
  return format_sci(value, true) + " params/s";
}

}  // namespace tide::planner
