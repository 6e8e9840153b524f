// Measuring the performance model's rates on this machine with the real kernels and copies: what
// `tide calibrate` runs, and what the executor's timing tests and the update_phase benchmark use
// to know the rates of the machine they run on.
//
// Each rate is the best of `repeats` timed runs over buffers of `params` parameters (the best,
// not the mean: on a shared machine the noise only ever slows a run down):
//   cpu_update            cpu_adam_step over one pinned subgroup (bf16 gradient and weight copy)
//   cpu_update_contended  the same while host→GPU and GPU→host copies run back to back
//   h2d, d2h              one copy of the state (12 bytes per parameter) from/to pinned memory
//   h2d_duplex, d2h_duplex  both directions at once, on two streams
//   gpu_update            the fused Adam kernel over the subgroup in device memory
//   host_memory           the Adam-pattern pass of planner/host_memory.h on the CPU pool
//   host_memory_contended the same while copies run in both directions: its bytes and theirs
// and, apart (measure_cpu_formats), the CPU update of each state format against fp32 state's.
// The driver context must be current on the calling thread.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>

#include "kernels/cpu_adam.h"
#include "planner/calibration_file.h"
#include "planner/cpu_update_factors.h"
#include "planner/rates.h"

namespace tide::planner {

struct MeasureOptions {
  std::uint64_t params = std::uint64_t{1} << 22;  // per buffer: 4 Mi parameters, 48 MiB of state
  int repeats = 3;
  // Each of the host memory pass's four buffers (planner/host_memory.h): together far larger
  // than a last-level cache.
  std::uint64_t host_memory_bytes = std::uint64_t{128} << 20;
  // The CPU update's threads (0: the whole pool) and instruction set (nullopt: the widest), as
  // the executor will run it (ExecutorOptions::cpu_threads, cpu_isa).
  unsigned cpu_threads = 0;
  std::optional<kernels::CpuIsa> cpu_isa;
  // Called after each rate with its kind and value (progress output); may be empty.
  std::function<void(RateKind, double)> progress;
};

Rates measure_rates(const MeasureOptions& options = {});

// The CPU update's options `options` asks for (its threads and instruction set).
kernels::CpuAdamOptions cpu_adam_options(const MeasureOptions& options);

// What the CPU update and a memcpy cost per second of this thread's CPU time (not wall time), over
// one pinned subgroup of `params` parameters, best of `repeats` after a warm-up: the same on a
// busy machine as on an idle one. Timing tests and the update_phase benchmark set the stand-in's
// simulated link from it so that a loaded machine picks the same link as an idle one.
// `options.threads` must be 1: CPU time is measured on the calling thread.
struct CpuCost {
  double update = 0;  // params/s
  double memcpy = 0;  // bytes/s (12 bytes per parameter: the subgroup's fp32 state)
};
CpuCost measure_cpu_cost(std::uint64_t params, const kernels::CpuAdamOptions& options,
                         int repeats = 3);

// One rank's share of the node, measured while the node's other ranks do the same (tide calibrate
// --ranks): wall-clock rates of the CPU update on the whole CPU pool (the rank's share of the
// cores when LOCAL_WORLD_SIZE is set) and of a memcpy of the subgroup's state, over one pinned
// subgroup of `params` parameters, best of `repeats`. `ready` is called once the buffers are
// warm, and the timed runs start when it returns (the ranks' barrier).
RankRates measure_rank_rates(std::uint64_t params, int repeats, const std::function<void()>& ready);

// The CPU update of fp32 state and of each state format (planner/cpu_update_factors.h), over
// pinned subgroups of `params` parameters with the same gradients (bf16, not zero: the 8-bit
// kernels' work depends on the values), in `repeats` rounds of one update of each, the best of
// each kept: the rounds spread every format's runs over the same time, so that a load that comes
// and goes slows them alike. Wall-clock rates, as measure_rates' cpu_update (the same `options`'
// threads and instruction set). `ready`, if given, is called once the buffers are warm, and the
// rounds start when it returns (tide calibrate --ranks: the ranks' barrier).
struct CpuFormatRates {
  double fp32 = 0;                                  // params/s
  std::array<double, kUpdateFormatCount> format{};  // params/s, in UpdateFormat order
};
CpuFormatRates measure_cpu_formats(std::uint64_t params, int repeats,
                                   const kernels::CpuAdamOptions& options = {},
                                   const std::function<void()>& ready = {});

// measure_cpu_formats while copies of another subgroup's state run in both directions, as
// measure_rates' cpu_update_contended: the formats' rates in the CPU side of an update phase that
// also has GPU subgroups. The driver context must be current on the calling thread.
CpuFormatRates measure_cpu_formats_while_copying(std::uint64_t params, int repeats,
                                                 const kernels::CpuAdamOptions& options = {});

// Each rate the slowest of the ranks' (one entry each, at least one).
CpuFormatRates slowest(std::span<const CpuFormatRates> ranks);

// The factors of the ranks' measurements (one entry each): for each format, the slowest rank's
// rate in the format over the slowest rank's fp32 rate, so that the planner's rate for one rank
// (the slowest's fp32 rate, tide calibrate --ranks) times the factor is the slowest's in the
// format. With `contended` (measure_cpu_formats_while_copying), the contended factors likewise,
// each rate taken no higher than the same rate alone.
// Throws std::runtime_error for a factor outside kMinCpuUpdateFactor..kMaxCpuUpdateFactor.
CpuUpdateFactors cpu_update_factors(std::span<const CpuFormatRates> ranks,
                                    const std::optional<CpuFormatRates>& contended = std::nullopt);

}  // namespace tide::planner
