#include "config/env.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

namespace tide::config {
namespace {

std::string format_value(std::string_view value) {
  std::string quoted = "\"";
  quoted.append(value);
  quoted += '"';
  return quoted;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    auto lower = [](char c) {
      return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

std::string format_number(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", value);
  return buffer;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A finite, non-negative decimal number that must use all of `text`.
std::optional<double> to_double(std::string_view text) {
  if (text.empty()) return std::nullopt;
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

EnvError::EnvError(std::string_view name, std::string_view value, std::string_view accepts)
    : std::invalid_argument(std::string(name) + "=" + format_value(value) + " is not valid: " +
                            std::string(name) + " accepts " + std::string(accepts)) {}

std::uint64_t parse_bytes(std::string_view name, std::string_view text) {
  static constexpr std::string_view kAccepts =
      "a size in bytes: a number with an optional unit B, KB, MB, GB, TB, KiB, MiB, GiB or TiB "
      "(e.g. 8GiB, 512MiB, 1.5GB, 4096)";
  const std::string_view s = trim(text);
  std::size_t split = 0;
  while (split < s.size() && ((s[split] >= '0' && s[split] <= '9') || s[split] == '.')) ++split;
  const auto number = to_double(s.substr(0, split));
  const std::string_view unit = trim(s.substr(split));
  struct Unit {
    std::string_view name;
    double factor;
  };
  static constexpr Unit kUnits[] = {{"", 1},
                                    {"B", 1},
                                    {"KB", 1e3},
                                    {"MB", 1e6},
                                    {"GB", 1e9},
                                    {"TB", 1e12},
                                    {"KiB", 1024.0},
                                    {"MiB", 1048576.0},
                                    {"GiB", 1073741824.0},
                                    {"TiB", 1099511627776.0},
                                    {"K", 1024.0},
                                    {"M", 1048576.0},
                                    {"G", 1073741824.0},
                                    {"T", 1099511627776.0}};
  if (!number) throw EnvError(name, text, kAccepts);
  for (const Unit& u : kUnits) {
    if (iequals(unit, u.name)) {
      const double bytes = *number * u.factor;
      if (bytes != std::floor(bytes) ||
          bytes >= static_cast<double>(std::numeric_limits<std::uint64_t>::max())) {
        throw EnvError(name, text, kAccepts);
      }
      return static_cast<std::uint64_t>(bytes);
    }
  }
  throw EnvError(name, text, kAccepts);
}

std::uint64_t parse_bytes(std::string_view name, std::string_view text, std::uint64_t min,
                          std::uint64_t max, std::string_view accepts) {
  std::uint64_t bytes = 0;
  try {
    bytes = parse_bytes(name, text);
  } catch (const EnvError&) {
    throw EnvError(name, text, accepts);
  }
  if (bytes < min || bytes > max) throw EnvError(name, text, accepts);
  return bytes;
}

bool parse_bool(std::string_view name, std::string_view text) {
  const std::string_view s = trim(text);
  for (std::string_view yes : {"1", "true", "yes", "on"}) {
    if (iequals(s, yes)) return true;
  }
  for (std::string_view no : {"0", "false", "no", "off"}) {
    if (iequals(s, no)) return false;
  }
  throw EnvError(name, text, "a boolean: 1/0, true/false, yes/no or on/off");
}

std::int64_t parse_int(std::string_view name, std::string_view text, std::int64_t min,
                       std::int64_t max) {
  const std::string_view s = trim(text);
  std::int64_t value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || value < min || value > max) {
    throw EnvError(name, text,
                   "an integer from " + std::to_string(min) + " to " + std::to_string(max));
  }
  return value;
}

double parse_double(std::string_view name, std::string_view text, double min, double max) {
  const std::string_view s = trim(text);
  double value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(value) ||
      value < min || value > max) {
    throw EnvError(name, text, "a number from " + format_number(min) + " to " + format_number(max));
  }
  return value;
}

std::size_t parse_choice(std::string_view name, std::string_view text,
                         std::initializer_list<std::string_view> choices) {
  const std::string_view s = trim(text);
  std::string accepts = "one of:";
  std::size_t index = 0;
  for (std::string_view choice : choices) {
    if (s == choice) return index;
    accepts += " ";
    accepts += choice;
    ++index;
  }
  throw EnvError(name, text, accepts);
}

std::optional<std::string> env_text(const char* name) {
  const char* value = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read-only use
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::optional<std::uint64_t> env_bytes(const char* name) {
  auto text = env_text(name);
  if (!text) return std::nullopt;
  return parse_bytes(name, *text);
}

std::optional<std::uint64_t> env_bytes(const char* name, std::uint64_t min, std::uint64_t max,
                                       std::string_view accepts) {
  auto text = env_text(name);
  if (!text) return std::nullopt;
  return parse_bytes(name, *text, min, max, accepts);
}

std::optional<bool> env_bool(const char* name) {
  auto text = env_text(name);
  if (!text) return std::nullopt;
  return parse_bool(name, *text);
}

std::optional<std::int64_t> env_int(const char* name, std::int64_t min, std::int64_t max) {
  auto text = env_text(name);
  if (!text) return std::nullopt;
  return parse_int(name, *text, min, max);
}

std::optional<double> env_double(const char* name, double min, double max) {
  auto text = env_text(name);
  if (!text) return std::nullopt;
  return parse_double(name, *text, min, max);
}

std::optional<std::size_t> env_choice(const char* name,
                                      std::initializer_list<std::string_view> choices) {
  auto text = env_text(name);
  if (!text) return std::nullopt;
  return parse_choice(name, *text, choices);
}

}  // namespace tide::config
