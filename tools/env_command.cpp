// `tide env`: every TIDE_* variable, what it accepts and does, and its current value (marked
// when tide would refuse it).
#include <cstdio>
#include <string>

#include "config/env.h"
#include "config/knobs.h"
#include "tools/command.h"

namespace tide::tools {

int env_command(int /*argc*/, char** /*argv*/) {
  int bad = 0;
  for (const auto& knob : config::knobs()) {
    const std::string name(knob.name);
    const auto value = config::env_text(name.c_str());
    std::string invalid;
    if (value && knob.check != nullptr) {
      try {
        knob.check(knob.name, *value);
      } catch (const config::EnvError&) {
        invalid = "   <- invalid: not what it accepts";
        ++bad;
      }
    }
    std::printf("%s=%s%s\n    accepts: %.*s\n    %.*s\n", name.c_str(),
                value ? value->c_str() : "(unset)", invalid.c_str(),
                static_cast<int>(knob.accepts.size()), knob.accepts.data(),
                static_cast<int>(knob.description.size()), knob.description.data());
  }
  if (bad != 0) {
    std::fprintf(stderr, "tide env: %d variable%s set to a value tide refuses (marked above)\n",
                 bad, bad == 1 ? " is" : "s are");
    return 1;
  }
  return 0;
}

}  // namespace tide::tools
