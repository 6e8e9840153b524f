// The one grammar of a placement: TIDE_PLACEMENT's value, tide.torch's `placement=` argument and
// the executor's policy all read it here. "auto" (the planner), "cpu", "gpu", or K >= 1: one GPU
// subgroup every K ("2", or "k2").
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace tide::config {

inline constexpr std::string_view kPlacementAccepts =
    "auto, cpu, gpu, or an integer K >= 1 (one GPU subgroup every K)";

struct Placement {
  enum class Kind : unsigned char { automatic, cpu, gpu, interleave };
  Kind kind = Kind::automatic;
  std::size_t k = 0;  // interleave: 1 to 2^30
};

// Nullopt for text that is not a placement.
std::optional<Placement> parse_placement(std::string_view text);

}  // namespace tide::config
