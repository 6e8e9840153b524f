// The interposer's knobs (registered in config/knobs.cpp), read once, on the first hooked call.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tide::interpose {

struct Settings {
  std::uint64_t memory_limit = 0;             // TIDE_MEMORY_LIMIT, bytes per device; 0: none
  std::optional<std::string> report_pattern;  // TIDE_REPORT; "%p" becomes the writer's pid
  bool stacks = false;                        // TIDE_STACKS
  std::uint32_t stack_sample = 1;             // TIDE_STACK_SAMPLE
};

// Throws config::EnvError for a bad value.
Settings read_settings();

// `pattern` with every "%p" replaced by `pid`.
std::string expand_report_path(const std::string& pattern, long pid);

}  // namespace tide::interpose
