#include "io/json_writer.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <system_error>

namespace tide::io::json {

void append_quoted(std::string& out, std::string_view text) {
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
      case '\r':
        out += "\\r";
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

std::string quote(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  append_quoted(out, text);
  return out;
}

std::string number(double value) {
  if (!std::isfinite(value)) return "null";  // JSON has no NaN or infinity
  // Whole numbers up to 2^53 print plainly (a count of parameters or bytes reads better that way).
  if (value == std::floor(value) && std::fabs(value) <= 9007199254740992.0) {
    return std::to_string(static_cast<std::int64_t>(value));
  }
  char buffer[32];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  if (ec != std::errc()) return "null";
  return std::string(buffer, end);
}

std::string& Object::member(std::string_view name) {
  if (members_++ > 0) body_ += ", ";
  append_quoted(body_, name);
  body_ += ": ";
  return body_;
}

Object& Object::add_uint(std::string_view name, std::uint64_t value) {
  member(name) += std::to_string(value);
  return *this;
}

Object& Object::add_string(std::string_view name, std::string_view value) {
  append_quoted(member(name), value);
  return *this;
}

Object& Object::add_bool(std::string_view name, bool value) {
  member(name) += value ? "true" : "false";
  return *this;
}

Object& Object::add_raw(std::string_view name, std::string_view json) {
  member(name) += json;
  return *this;
}

Object& Object::add(std::string_view name, const Object& value) {
  return add_raw(name, value.text());
}

Object& Object::add(std::string_view name, const Array& value) {
  return add_raw(name, value.text());
}

std::string Object::text() const { return "{" + body_ + "}"; }

std::string& Array::item() {
  if (items_++ > 0) body_ += separator_;
  return body_;
}

Array& Array::add_uint(std::uint64_t value) {
  item() += std::to_string(value);
  return *this;
}

Array& Array::add_string(std::string_view value) {
  append_quoted(item(), value);
  return *this;
}

Array& Array::add_raw(std::string_view json) {
  item() += json;
  return *this;
}

Array& Array::add(const Object& value) { return add_raw(value.text()); }

std::string Array::text() const { return "[" + body_ + "]"; }

}  // namespace tide::io::json
