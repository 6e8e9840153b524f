// Byte counts for people, in the unit that fits: "640 B", "1.50 MiB", "12.3 GiB". Parsing sizes
// is env.h's (env_bytes); every message of tide that shows a size formats it here.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace tide::config {

// `bytes` in B, KiB, MiB, GiB or TiB (the largest unit it is at least one of), with three
// significant digits ("1.50 MiB", "640 KiB", "12.3 GiB"); bytes themselves exactly ("512 B").
std::string format_bytes(std::uint64_t bytes);

// Several byte counts of one message, each in its own unit, with as many digits as it takes for
// counts that differ to read differently ("1.000 MiB" and "1.004 MiB", not twice "1.00 MiB"): a
// message that compares sizes never shows two different ones as equal.
std::vector<std::string> format_bytes_apart(std::initializer_list<std::uint64_t> counts);

}  // namespace tide::config
