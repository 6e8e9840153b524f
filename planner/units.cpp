#include "planner/units.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <system_error>

#include "config/env.h"

namespace tide::planner {

std::string format_sci(double value, bool keep_zeros) {
  if (value == 0) return "0";
  char buffer[48];
  std::snprintf(buffer, sizeof buffer, "%.2e", value);
  // "2.20e+09" → "2.20e9"; "1.00e+08" → "1e8".
  std::string text = buffer;
  const auto e = text.find('e');
  if (e == std::string::npos) return text;
  std::string mantissa = text.substr(0, e);
  std::string exponent = text.substr(e + 1);
  if (!keep_zeros && mantissa.size() >= 4 && mantissa.compare(mantissa.size() - 3, 3, ".00") == 0) {
    mantissa.resize(mantissa.size() - 3);
  }
  bool negative = false;
  std::size_t i = 0;
  if (i < exponent.size() && (exponent[i] == '+' || exponent[i] == '-')) {
    negative = exponent[i] == '-';
    ++i;
  }
  while (i + 1 < exponent.size() && exponent[i] == '0') ++i;
  return mantissa + "e" + (negative ? "-" : "") + exponent.substr(i);
}

std::string format_gb(double bytes) {
  char buffer[48];
  std::snprintf(buffer, sizeof buffer, "%.2f GB", bytes / 1e9);
  return buffer;
}

std::uint64_t parse_count(std::string_view name, std::string_view text, std::uint64_t min) {
  const std::string accepts = "a whole number of parameters >= " + std::to_string(min) +
                              ", e.g. 2e10, 20000000000, 20B, 100M (K, M, B, T: powers of 1000)";
  std::string_view s = text;
  double factor = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K':
      case 'k':
        factor = 1e3;
        break;
      case 'M':
        factor = 1e6;
        break;
      case 'B':
      case 'G':
        factor = 1e9;
        break;
      case 'T':
        factor = 1e12;
        break;
      default:
        break;
    }
    if (factor != 1) s.remove_suffix(1);
  }
  double value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(value)) {
    throw config::EnvError(name, text, accepts);
  }
  value *= factor;
  if (value != std::floor(value) || value < static_cast<double>(min) || value >= 9.0e18) {
    throw config::EnvError(name, text, accepts);
  }
  return static_cast<std::uint64_t>(value);
}

}  // namespace tide::planner
