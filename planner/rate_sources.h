// Where the rates come from: built-in defaults, then the calibration file, then TIDE_RATE_*
// variables, each overriding the one before (and `tide plan`'s flags over all of them).
#pragma once

#include <array>
#include <filesystem>
#include <optional>

#include "planner/calibration_file.h"
#include "planner/rates.h"

namespace tide::planner {

enum class RateSource { builtin, calibration, environment, given };

// "built-in default", "calibration file", "environment", "given".
const char* source_name(RateSource source);

struct ResolvedRates {
  Rates rates;
  std::array<RateSource, kRateCount> source{};
  // The calibration file that was read, and what it held; nullopt when none was.
  std::optional<std::filesystem::path> calibration_path;
  std::optional<Calibration> calibration;

  bool all_builtin() const;
  // The calibration's CPU update factors by state format (none without one). Ratios to the fp32
  // CPU update rate: they apply to it whatever set it (calibration, TIDE_RATE_*, flags).
  CpuUpdateFactors cpu_update_factors() const {
    return calibration ? calibration->cpu_update_factors : CpuUpdateFactors{};
  }
};

// `calibration_file`: a file that must be readable and valid; nullopt: the default path
// (default_calibration_path()), read if it exists. A file that exists but is not a valid
// calibration is an error either way: a broken calibration must not silently become defaults.
ResolvedRates resolve_rates(const std::optional<std::filesystem::path>& calibration_file);

}  // namespace tide::planner
