// Writing JSON text: the string escaping and number formatting every JSON tide writes goes through
// (the calibration file, `--json` outputs, the interposer's report, Chrome traces), and objects and
// arrays built member by member.
//
// Hand-written rather than a library's: the LD_PRELOAD interposer links it into other people's
// processes, where it must add no dependency, and tide's files keep the number format their
// readers (tide's own reader, Python, people) already see: integers up to 2^53 without exponent
// or decimal point, other numbers in their shortest round-trip form.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tide::io::json {

// A JSON string literal: quoted, with '"', '\' and control characters escaped (RFC 8259). Bytes
// from 0x80 up pass through unchanged: UTF-8 stays UTF-8.
std::string quote(std::string_view text);
void append_quoted(std::string& out, std::string_view text);

// A number that reads back as the same double: whole numbers up to 2^53 plainly ("2200000000" for
// 2.2e9: counts of parameters and bytes read better so), others in the shortest form that reads
// back the same ("0.1", "1e+300"); NaN and the infinities, which JSON lacks, as null.
std::string number(double value);

class Array;

// An object written member by member into a string: {"name": value, "other": value}, with the
// separators (", " and ": ") and the quoting of names done here.
class Object {
 public:
  Object& add_uint(std::string_view name, std::uint64_t value);
  Object& add_string(std::string_view name, std::string_view value);
  Object& add_bool(std::string_view name, bool value);
  // `json`: a value already written as JSON (a number in a chosen format, a nested value).
  Object& add_raw(std::string_view name, std::string_view json);
  Object& add(std::string_view name, const Object& value);
  Object& add(std::string_view name, const Array& value);

  std::string text() const;  // "{...}"

 private:
  std::string& member(std::string_view name);  // appends the separator and the name
  std::string body_;
  std::size_t members_ = 0;
};

// An array written item by item: [value, value], items separated by `separator`.
class Array {
 public:
  explicit Array(std::string_view separator = ", ") : separator_(separator) {}

  Array& add_uint(std::uint64_t value);
  Array& add_string(std::string_view value);
  Array& add_raw(std::string_view json);
  Array& add(const Object& value);

  std::string text() const;  // "[...]"

 private:
  std::string& item();  // appends the separator
  std::string separator_;
  std::string body_;
  std::size_t items_ = 0;
};

}  // namespace tide::io::json
