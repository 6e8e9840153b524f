// The registry of every TIDE_* environment variable: its name, what it accepts and what it does.
//
// `tide env` prints it, and a test checks that every TIDE_* name in the sources is registered
// here and documented in the README, so a knob cannot be added silently.
#pragma once

#include <span>
#include <string_view>

namespace tide::config {

struct Knob {
  std::string_view name;
  std::string_view accepts;
  std::string_view description;
};

std::span<const Knob> knobs();

}  // namespace tide::config
