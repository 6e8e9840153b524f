// Strict parsing of TIDE_* environment variables.
//
// Every knob is read through these functions so that a bad value always fails the same way: an
// EnvError whose message names the variable, the value given and what the variable accepts.
// An unset or empty variable means "not given" (std::nullopt).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tide::config {

class EnvError : public std::invalid_argument {
 public:
  EnvError(std::string_view name, std::string_view value, std::string_view accepts);
};

// Parsers over a text value; `name` only labels the error.
// Sizes: a number with an optional unit B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB
// (powers of 1024), case-insensitive, e.g. "8GiB", "1.5GB", "4096".
std::uint64_t parse_bytes(std::string_view name, std::string_view text);
// A size from `min` to `max`; `accepts` (e.g. "a size from 4MiB to 1TiB") names the range.
std::uint64_t parse_bytes(std::string_view name, std::string_view text, std::uint64_t min,
                          std::uint64_t max, std::string_view accepts);
// Booleans: 1/0, true/false, yes/no, on/off.
bool parse_bool(std::string_view name, std::string_view text);
std::int64_t parse_int(std::string_view name, std::string_view text, std::int64_t min,
                       std::int64_t max);
double parse_double(std::string_view name, std::string_view text, double min, double max);
// One of `choices`, exactly (case-sensitive); returns the index of the match.
std::size_t parse_choice(std::string_view name, std::string_view text,
                         std::initializer_list<std::string_view> choices);

// The variable's value, or nullopt when unset or empty.
std::optional<std::string> env_text(const char* name);

std::optional<std::uint64_t> env_bytes(const char* name);
std::optional<std::uint64_t> env_bytes(const char* name, std::uint64_t min, std::uint64_t max,
                                       std::string_view accepts);
std::optional<bool> env_bool(const char* name);
std::optional<std::int64_t> env_int(const char* name, std::int64_t min, std::int64_t max);
std::optional<double> env_double(const char* name, double min, double max);
std::optional<std::size_t> env_choice(const char* name,
                                      std::initializer_list<std::string_view> choices);

}  // namespace tide::config
