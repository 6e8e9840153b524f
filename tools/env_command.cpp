// `tide env`: every TIDE_* variable, what it accepts and does, and its current value.
#include <cstdio>
#include <string>

#include "config/env.h"
#include "config/knobs.h"
#include "tools/command.h"

namespace tide::tools {

int env_command(int /*argc*/, char** /*argv*/) {
  for (const auto& knob : config::knobs()) {
    const std::string name(knob.name);
    const auto value = config::env_text(name.c_str());
    std::printf("%s=%s\n    accepts: %.*s\n    %.*s\n", name.c_str(),
                value ? value->c_str() : "(unset)", static_cast<int>(knob.accepts.size()),
                knob.accepts.data(), static_cast<int>(knob.description.size()),
                knob.description.data());
  }
  return 0;
}

}  // namespace tide::tools
