// The CPU update's rate of each optimizer state format against fp32 state's, as `tide calibrate`
// measures it on this machine.
//
// The rates (planner/rates.h) are fp32 state's. A GPU update is memory-bound, so its rate in
// another format follows from the bytes it moves; a CPU update is not always: the 8-bit kernels
// are compute-bound, bf16 moments and bf16 master weights partly so, by how much depends on the
// CPU and its load (README: 1.15-1.24x for bf16 moments where the bytes say 1.4x, 0.36-0.66x for
// 8-bit moments). Calibration measures each format's CPU update paired with fp32 state's, and
// keeps the ratio: it applies to whatever fp32 rate the planner uses (calibrated, TIDE_RATE_*,
// tide plan's flags, refined while training). A format it did not measure falls back to the
// performance model's own factor (Footprint::model_cpu_update_scale).
//
// The CPU update while copies run (Rates::cpu_update_contended) has factors of its own: the
// copies take host memory bandwidth, which slows a memory-bound format (fp32 state) more than a
// compute-bound one (8-bit moments), so a format's rate over fp32 state's is not the same with
// copies running as without. Calibration measures both; a file without the contended ones
// (older files, tide calibrate --ranks, which runs no copies) applies the free factor to both.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

namespace tide::planner {

// The state formats with a CPU kernel of their own (kernels/cpu_adam.h), fp32 state aside: the
// moments' format with fp32 master weights, and bf16 master weights with fp32 or bf16 moments
// (8-bit moments with bf16 master weights have no kernel).
enum class UpdateFormat : std::size_t {
  bf16_moments,
  q8_moments,
  bf16_master,
  bf16_master_bf16_moments,
};
inline constexpr std::size_t kUpdateFormatCount = 4;

struct UpdateFormatInfo {
  UpdateFormat format;
  std::string_view key;          // the calibration file's key, e.g. "q8_moments"
  std::string_view description;  // e.g. "8-bit moments"
};
// In UpdateFormat order.
inline constexpr std::array<UpdateFormatInfo, kUpdateFormatCount> kUpdateFormats = {{
    {UpdateFormat::bf16_moments, "bf16_moments", "bf16 moments"},
    {UpdateFormat::q8_moments, "q8_moments", "8-bit moments"},
    {UpdateFormat::bf16_master, "bf16_master", "bf16 master, fp32 moments"},
    {UpdateFormat::bf16_master_bf16_moments, "bf16_master_bf16_moments",
     "bf16 master, bf16 moments"},
}};
inline const UpdateFormatInfo& update_format_info(UpdateFormat format) {
  return kUpdateFormats[static_cast<std::size_t>(format)];
}

// Accepted range of a factor: anything outside is a measurement gone wrong, not a CPU.
inline constexpr double kMinCpuUpdateFactor = 0.01;
inline constexpr double kMaxCpuUpdateFactor = 100;
// Within the accepted range (NaN is not).
inline bool plausible_cpu_update_factor(double factor) {
  return factor >= kMinCpuUpdateFactor && factor <= kMaxCpuUpdateFactor;
}

// By format, the CPU update rate over fp32 state's, alone (`factor`) and while copies run
// (`contended`: the format's contended rate over fp32 state's contended rate); 0 where not
// measured.
struct CpuUpdateFactors {
  std::array<double, kUpdateFormatCount> factor{};
  std::array<double, kUpdateFormatCount> contended{};

  double operator[](UpdateFormat f) const { return factor[static_cast<std::size_t>(f)]; }
  double& operator[](UpdateFormat f) { return factor[static_cast<std::size_t>(f)]; }
  bool measured(UpdateFormat f) const { return (*this)[f] > 0; }
  // The contended factor, the free one where the contended one was not measured (0: neither).
  double contended_or_free(UpdateFormat f) const {
    const double c = contended[static_cast<std::size_t>(f)];
    return c > 0 ? c : (*this)[f];
  }
  bool any() const {
    for (double x : factor) {
      if (x > 0) return true;
    }
    return any_contended();
  }
  bool any_contended() const {
    for (double x : contended) {
      if (x > 0) return true;
    }
    return false;
  }
  bool operator==(const CpuUpdateFactors&) const = default;
};

}  // namespace tide::planner
