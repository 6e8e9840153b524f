// Small helpers for writing JSON text by hand (the report is written at exit, from a preload that
// must not pull in a JSON library).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tide::interpose {

// Appends `text` as a quoted JSON string.
void append_json_string(std::string& out, std::string_view text);

// "name": <value>, with a leading comma unless `first`.
void append_json_member(std::string& out, bool& first, std::string_view name, std::uint64_t value);
void append_json_member(std::string& out, bool& first, std::string_view name,
                        std::string_view value);
void append_json_raw_member(std::string& out, bool& first, std::string_view name,
                            std::string_view raw_json);

// A byte count for people: "1.50 GiB".
std::string format_bytes(std::uint64_t bytes);

}  // namespace tide::interpose
