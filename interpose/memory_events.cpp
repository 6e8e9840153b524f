#include "interpose/memory_events.h"

namespace tide::interpose {

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::unmarked:
      return "unmarked";
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::update:
      return "update";
    case Phase::count:
      break;
  }
  return "unknown";
}

Phase phase_from_name(std::string_view name) {
  for (Phase p : {Phase::forward, Phase::backward, Phase::update}) {
    if (name == phase_name(p)) return p;
  }
  return Phase::count;
}

}  // namespace tide::interpose
