#include "config/bytes.h"

#include <cstdio>
#include <iterator>

namespace tide::config {
namespace {

constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};

// With `extra` more significant digits than three.
std::string format(std::uint64_t bytes, int extra) {
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  char text[48];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%llu B", static_cast<unsigned long long>(bytes));
    return text;
  }
  // Three significant digits: 1.50, 12.3, 640 (value is below 1024).
  const int decimals = (value < 10 ? 2 : value < 100 ? 1 : 0) + extra;
  std::snprintf(text, sizeof text, "%.*f %s", decimals, value, kUnits[unit]);
  return text;
}

}  // namespace

std::string format_bytes(std::uint64_t bytes) { return format(bytes, 0); }

std::vector<std::string> format_bytes_apart(std::initializer_list<std::uint64_t> counts) {
  std::vector<std::uint64_t> values(counts);
  std::vector<std::string> out(values.size());
  // 1 TiB needs 13 significant digits to show every byte; more never changes a string.
  for (int extra = 0; extra <= 13; ++extra) {
    for (std::size_t i = 0; i < values.size(); ++i) out[i] = format(values[i], extra);
    bool apart = true;
    for (std::size_t i = 0; i < values.size() && apart; ++i) {
      for (std::size_t j = i + 1; j < values.size() && apart; ++j) {
        apart = values[i] == values[j] || out[i] != out[j];
      }
    }
    if (apart) break;
  }
  return out;
}

}  // namespace tide::config
