#include "interpose/settings.h"

#include <cstdint>
#include <limits>

#include "config/env.h"
#include "config/knobs.h"

namespace tide::interpose {

std::string expand_report_path(const std::string& pattern, long pid) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'p') {
      out += std::to_string(pid);
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

Settings read_settings() {
  Settings s;
  // 0 is refused rather than read as no limit: unset means none (as TIDE_ALLOC_MAX_BYTES).
  s.memory_limit =
      config::env_bytes("TIDE_MEMORY_LIMIT", 1, std::numeric_limits<std::uint64_t>::max(),
                        config::kLimitAccepts)
          .value_or(0);
  if (auto path = config::env_text("TIDE_REPORT")) {
    s.report_pattern = *path;
  }
  s.stacks = config::env_bool("TIDE_STACKS").value_or(false);
  s.stack_sample =
      static_cast<std::uint32_t>(config::env_int("TIDE_STACK_SAMPLE", 1, 1000000000).value_or(1));
  return s;
}

}  // namespace tide::interpose
