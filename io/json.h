// A small strict JSON reader (the writer is json_writer.h).
//
// The calibration file is JSON so that people and the Python layer can read it with anything;
// this reader exists because the project takes no third-party dependency for one small file.
// It accepts RFC 8259 JSON only (no comments, no trailing commas, no NaN), rejects duplicate
// keys, nests at most 64 levels deep, and reports errors with line and column.
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tide::io::json {

class ParseError : public std::invalid_argument {
 public:
  ParseError(std::size_t line, std::size_t column, const std::string& what);
  std::size_t line() const { return line_; }
  std::size_t column() const { return column_; }

 private:
  std::size_t line_;
  std::size_t column_;
};

class Value {
 public:
  enum class Kind { null, boolean, number, string, array, object };
  using Member = std::pair<std::string, Value>;

  Value() = default;
  static Value make_bool(bool b);
  static Value make_number(double d);
  static Value make_string(std::string s);
  static Value make_array(std::vector<Value> items);
  static Value make_object(std::vector<Member> members);

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::null; }
  bool boolean() const { return boolean_; }
  double number() const { return number_; }
  const std::string& string() const { return string_; }
  const std::vector<Value>& items() const { return items_; }
  // Members in file order; keys are unique.
  const std::vector<Member>& members() const { return members_; }
  // The member named `key`, or nullptr (also when this is not an object).
  const Value* find(std::string_view key) const;

 private:
  Kind kind_ = Kind::null;
  bool boolean_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<Value> items_;
  std::vector<Member> members_;
};

// Parses one JSON text (surrounding whitespace allowed). Throws ParseError.
Value parse(std::string_view text);

// The name of a kind, for messages ("a number", "an object", ...).
const char* kind_name(Value::Kind kind);

}  // namespace tide::io::json
