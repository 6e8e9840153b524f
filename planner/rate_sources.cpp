#include "planner/rate_sources.h"

#include <system_error>

#include "config/env.h"

namespace tide::planner {

const char* source_name(RateSource source) {
  switch (source) {
    case RateSource::builtin:
      return "built-in default";
    case RateSource::calibration:
      return "calibration file";
    case RateSource::environment:
      return "environment";
    case RateSource::given:
      return "given";
  }
  return "?";
}

bool ResolvedRates::all_builtin() const {
  for (RateSource s : source) {
    if (s != RateSource::builtin) return false;
  }
  return true;
}

ResolvedRates resolve_rates(const std::optional<std::filesystem::path>& calibration_file) {
  ResolvedRates resolved;
  resolved.rates = builtin_rates();
  resolved.source.fill(RateSource::builtin);

  std::optional<std::filesystem::path> path = calibration_file;
  if (!path) {
    if (auto named = config::env_text("TIDE_CALIBRATION_FILE")) {
      // Named explicitly: it must be there.
      std::error_code ec;
      if (!std::filesystem::is_regular_file(*named, ec)) {
        throw config::EnvError("TIDE_CALIBRATION_FILE", *named,
                               "the path of an existing calibration file (`tide calibrate` "
                               "writes one)");
      }
      path = *named;
    }
  }
  if (!path) {
    // No HOME and no TIDE_CALIBRATION_FILE: there is no default file, so defaults it is.
    try {
      std::filesystem::path candidate = default_calibration_path();
      std::error_code ec;
      if (std::filesystem::exists(candidate, ec)) path = candidate;
    } catch (const CalibrationError&) {
    }
  }
  if (path) {
    resolved.calibration = load_calibration(*path);
    resolved.calibration_path = *path;
    resolved.rates = resolved.calibration->rates;
    resolved.source.fill(RateSource::calibration);
    for (std::size_t i = 0; i < kRateCount; ++i) {
      if (resolved.calibration->rate_missing[i]) resolved.source[i] = RateSource::builtin;
    }
  }

  const auto overridden = apply_env_overrides(resolved.rates);
  for (std::size_t i = 0; i < kRateCount; ++i) {
    if (overridden[i]) resolved.source[i] = RateSource::environment;
  }
  return resolved;
}

}  // namespace tide::planner
