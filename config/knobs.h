// The registry of every TIDE_* environment variable: its name, what it accepts and what it does.
//
// `tide env` prints it, and a test checks that every TIDE_* name in the sources is registered
// here and documented in the README, so a knob cannot be added silently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace tide::config {

// What the knobs whose readers share their range with the registry accept.
inline constexpr std::string_view kPinnedChunkAccepts = "a size from 4MiB to 1TiB (e.g. 256MiB)";
inline constexpr std::string_view kPinnedDirectAccepts = "a size from 16KiB to 1TiB (e.g. 1MiB)";
inline constexpr std::string_view kLimitAccepts =
    "a size greater than 0 (e.g. 20GiB); unset or empty for no limit";

struct Knob {
  std::string_view name;
  std::string_view accepts;
  std::string_view description;
  // Throws EnvError when a value is not one the variable accepts: the same ranges as where it
  // is read, so that `tide env` can mark a bad value and `tide run` refuse it before the program
  // starts. Null: any value (or checked only where it is read).
  void (*check)(std::string_view name, std::string_view value) = nullptr;
};

std::span<const Knob> knobs();
// The registered knob `name`, or null.
const Knob* find_knob(std::string_view name);
// Checks every registered variable that is set; throws the first one's EnvError.
void check_environment();

// A knob's parsed value, for the knobs tide.torch and the executor read (TIDE_SUBGROUP_SIZE,
// TIDE_GPU_CHUNK: `integer`;
// TIDE_STATE_DTYPE, TIDE_MASTER_DTYPE, TIDE_STATE_ROUNDING: `choice`, the index of the choice in
// the order the registry's `accepts` names them). TIDE_PLACEMENT's grammar is config/placement.h's.
struct KnobValue {
  bool set = false;  // given: not unset, not empty
  std::size_t choice = 0;
  std::int64_t integer = 0;
};
// `value` parsed as knob `name` (nullopt: the environment's); EnvError for a bad value,
// std::invalid_argument for a knob it does not parse.
KnobValue read_knob(std::string_view name, std::optional<std::string_view> value);

}  // namespace tide::config
