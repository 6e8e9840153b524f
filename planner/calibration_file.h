// The calibration file: the rates `tide calibrate` measured, and the machine it measured them on.
//
// Format (JSON, version 1; every member below is required unless marked optional, and unknown
// members are rejected so that a typo cannot silently fall back to a default):
//
//   {
//     "format": "tide-calibration",
//     "version": 1,
//     "measured_at": "2025-01-31T12:00:00Z",        // optional: when, UTC, ISO 8601
//     "machine": {
//       "hostname": "node17",
//       "cpu_model": "AMD EPYC 9654 96-Core Processor",   // optional
//       "cpu_threads": 24,          // threads the CPU update used (its rate depends on them)
//       "gpu_name": "NVIDIA H100 80GB HBM3",              // optional
//       "gpu_memory_bytes": 85520809984,                  // optional
//       "ranks_per_host": 4         // optional (default 1): ranks that ran while measuring
//     },
//     "rates": {                    // per rank; each a finite number > 0
//       "cpu_update_params_per_s": 2.2e9,
//       "cpu_update_contended_params_per_s": 2.0e9,
//       "h2d_bytes_per_s": 25e9,
//       "d2h_bytes_per_s": 25e9,
//       "h2d_duplex_bytes_per_s": 23e9,
//       "d2h_duplex_bytes_per_s": 23e9,
//       "gpu_update_params_per_s": 5e10,
//       "host_memory_bytes_per_s": 1.2e11,            // optional (files before them: the
//       "host_memory_contended_bytes_per_s": 1.1e11   // built-in defaults), CPU alone and
//     },                                              // CPU with both copy directions
//     "ranks": [                    // optional (tide calibrate --ranks N): one entry per rank of
//       {"cpu_update_params_per_s": 5.1e8,       // ranks_per_host, what each measured while all
//        "memory_bytes_per_s": 9.8e9}, ...       // updated (and copied memory) at once, on its
//     ],                                         // share of the node's cores
//     "cpu_update_factors": {       // optional, and each member: the CPU update's rate in a state
//       "bf16_moments": 1.2,        // format over fp32 state's (planner/cpu_update_factors.h),
//       "q8_moments": 0.5,          // measured in the same rounds (with --ranks, the slowest
//       "bf16_master": 0.7,         // rank's over the slowest rank's); a number from 0.01 to 100.
//       "bf16_master_bf16_moments": 0.8     // Absent (older files): the performance model's
//     },                                    // factor (Footprint::model_cpu_update_scale)
//     "cpu_update_contended_factors": {     // optional, the same members: the same ratio while
//       "bf16_moments": 1.3, ...            // copies run (cpu_update_contended's). Absent (older
//     }                                     // files, --ranks): cpu_update_factors' for both rates
//   }
//
// Where it lives: $TIDE_CALIBRATION_FILE if set, else $XDG_CACHE_HOME/tide/calibration.json
// (when XDG_CACHE_HOME is an absolute path), else $HOME/.cache/tide/calibration.json.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "planner/cpu_update_factors.h"
#include "planner/rates.h"

namespace tide::planner {

inline constexpr std::string_view kCalibrationFormat = "tide-calibration";
inline constexpr int kCalibrationVersion = 1;

struct MachineInfo {
  std::string hostname;
  std::string cpu_model;  // empty: unknown
  int cpu_threads = 0;
  std::string gpu_name;                // empty: unknown
  std::uint64_t gpu_memory_bytes = 0;  // 0: unknown
  int ranks_per_host = 1;

  bool operator==(const MachineInfo&) const = default;
};

// What one of the node's ranks measured while every rank ran at once.
struct RankRates {
  double cpu_update = 0;  // params/s
  double memory = 0;      // bytes/s: memcpy of the subgroup's state, read + write counted once
  bool operator==(const RankRates&) const = default;
};

struct Calibration {
  MachineInfo machine;
  std::string measured_at;  // empty: unknown
  Rates rates;
  std::vector<RankRates> ranks;         // empty, or machine.ranks_per_host entries
  CpuUpdateFactors cpu_update_factors;  // 0 for a format not measured
  // Rates the file lacks (RateInfo::optional_in_file), by RateKind: `rates` has the built-in
  // default there. Written files always have every rate.
  std::array<bool, kRateCount> rate_missing{};

  bool operator==(const Calibration&) const = default;
};

// A file that cannot be read or is not a valid calibration. The message names the file, where
// in it (line and column, or the member's path such as rates.h2d_bytes_per_s) and what is wrong.
class CalibrationError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Text ↔ Calibration. `origin` labels errors (a path, or "<text>").
Calibration parse_calibration(std::string_view text, std::string_view origin);
std::string format_calibration(const Calibration& calibration);

// Reads a regular file only (symlinks followed; a FIFO or device is refused, never waited on).
Calibration load_calibration(const std::filesystem::path& path);
// Writes atomically, creating the folder (io/safe_file.h: symlinks are written through,
// and only an absent path or an existing calibration file is replaced; anything else is
// refused with CalibrationError).
void save_calibration(const std::filesystem::path& path, const Calibration& calibration);
// Throws the CalibrationError save_calibration would for `path`, writing nothing.
void check_calibration_path(const std::filesystem::path& path);

// The path described above. Throws if neither TIDE_CALIBRATION_FILE nor HOME nor an absolute
// XDG_CACHE_HOME is set.
std::filesystem::path default_calibration_path();

// What can be learnt about this host without a GPU: hostname, CPU model (/proc/cpuinfo) and
// hardware threads. The GPU fields are left for the caller (it knows the device).
MachineInfo this_machine();

// The current time as ISO 8601 UTC ("2025-01-31T12:00:00Z"), for measured_at.
std::string utc_timestamp();

}  // namespace tide::planner
