// Formatting and parsing of the quantities the scheduler shows and reads: counts of parameters,
// bytes, seconds.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tide::planner {

// "2.20e9", "1e8" style: three significant digits, no "+" or leading zeros in the exponent, and
// a mantissa of exactly 1, 2, ... shortened to "1e8" unless `keep_zeros`.
std::string format_sci(double value, bool keep_zeros = false);
// "1.20 GB" (powers of 1000, as the copy rates are in GB/s).
std::string format_gb(double bytes);

// A count of parameters: a number (2e10, 20000000000, 1.5e9) with an optional suffix K, M, B
// (or G), T for powers of 1000 ("20B", "100M"). Must be a whole number from `min` up; throws
// config::EnvError naming `name` otherwise.
std::uint64_t parse_count(std::string_view name, std::string_view text, std::uint64_t min);

}  // namespace tide::planner
