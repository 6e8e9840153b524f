#include "interpose/json_text.h"

#include <cstdio>

namespace tide::interpose {

void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

namespace {

void append_name(std::string& out, bool& first, std::string_view name) {
  if (!first) out += ", ";
  first = false;
  append_json_string(out, name);
  out += ": ";
}

}  // namespace

void append_json_member(std::string& out, bool& first, std::string_view name, std::uint64_t value) {
  append_name(out, first, name);
  out += std::to_string(value);
}

void append_json_member(std::string& out, bool& first, std::string_view name,
                        std::string_view value) {
  append_name(out, first, name);
  append_json_string(out, value);
}

void append_json_raw_member(std::string& out, bool& first, std::string_view name,
                            std::string_view raw_json) {
  append_name(out, first, name);
  out += raw_json;
}

std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(text, sizeof text, "%.2f %s", value, kUnits[unit]);
  }
  return text;
}

}  // namespace tide::interpose
