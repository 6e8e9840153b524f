// The rates of the performance model: how fast one rank's CPU updates, copies and GPU updates go.
//
// All rates are per rank (per GPU), measured with every rank of the node running, because that is
// what one rank's update phase sees: ranks on a host share its memory bandwidth.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace tide::planner {

// The built-in host memory rates, per rank (builtin_rates() says why).
inline constexpr double kBuiltinHostMemory = 120e9;
inline constexpr double kBuiltinHostMemoryContended = 110e9;

struct Rates {
  double cpu_update = 0;            // params/s: all CPU update threads, no copies running
  double cpu_update_contended = 0;  // params/s: the same while copies run (shared host memory)
  double h2d = 0;                   // bytes/s: pinned host → GPU, alone on the link
  double d2h = 0;                   // bytes/s: GPU → pinned host, alone on the link
  double h2d_duplex = 0;            // bytes/s: host → GPU while a GPU → host copy also runs
  double d2h_duplex = 0;            // bytes/s: GPU → host while a host → GPU copy also runs
  double gpu_update = 0;            // params/s: the fused Adam kernel
  // bytes/s through host DRAM (reads + writes): the CPU update threads alone, and everything
  // (CPU threads and both copy directions' DMA) while copies run in both directions. The CPU
  // update and the copies of GPU subgroups share it (performance_model.h, "Host memory").
  // Unlike the others they default to the built-in rates': rates put together before they
  // existed (tests, tide_rates of the C ABI) get a host memory that binds only a fast CPU.
  double host_memory = kBuiltinHostMemory;
  double host_memory_contended = kBuiltinHostMemoryContended;

  bool operator==(const Rates&) const = default;
};

// One rate, named consistently everywhere it appears.
enum class RateKind : std::size_t {
  cpu_update,
  cpu_update_contended,
  h2d,
  d2h,
  h2d_duplex,
  d2h_duplex,
  gpu_update,
  host_memory,
  host_memory_contended,
};
inline constexpr std::size_t kRateCount = 9;

struct RateInfo {
  RateKind kind;
  double Rates::*member;
  std::string_view key;          // calibration file key under "rates", e.g. "h2d_bytes_per_s"
  std::string_view knob;         // TIDE_* override, e.g. "TIDE_RATE_H2D_GBPS"
  std::string_view flag;         // `tide plan` option, e.g. "--h2d-gbps"
  std::string_view description;  // for tables, e.g. "host to GPU copy, alone"
  // The knob and the flag take the rate in `unit` (params/s or GB/s); the file and the API use
  // params/s or bytes/s, so value = given × scale.
  std::string_view unit;
  double scale;
  double min_given;  // the accepted range of the knob and flag, in `unit`
  double max_given;
  // Added after calibration files existed: a file without it takes the built-in default.
  bool optional_in_file = false;
};

// The rates, in RateKind order.
std::span<const RateInfo, kRateCount> rate_infos();
const RateInfo& rate_info(RateKind kind);

inline double& rate_of(Rates& rates, RateKind kind) { return rates.*rate_info(kind).member; }
inline double rate_of(const Rates& rates, RateKind kind) { return rates.*rate_info(kind).member; }

// Rates for an H100-class node with 4 ranks per host (the setting of the paper tide follows),
// used when no calibration file exists. Clearly labelled wherever they are shown.
Rates builtin_rates();

// Throws std::invalid_argument naming the first rate that is not a finite number > 0.
void validate(const Rates& rates, std::string_view origin);

// Applies the TIDE_RATE_* variables that are set (strictly parsed; a bad value throws
// config::EnvError). Returns which rates were overridden.
std::array<bool, kRateCount> apply_env_overrides(Rates& rates);

// "2.20e9 params/s" or "25.0 GB/s".
std::string format_rate(RateKind kind, double value);

}  // namespace tide::planner
