// Where `tide run` puts its reports when the user names no place: a per-user directory,
// $XDG_STATE_HOME/tide/reports (else ~/.local/state/tide/reports), never the program's working
// directory. It keeps the most recent reports only, so that it does not grow without bound.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>

namespace tide::tools {

// Reports (with their traces) the directory keeps: older ones go when a new run starts.
inline constexpr std::size_t kKeptReports = 64;

// The directory: $XDG_STATE_HOME/tide/reports when XDG_STATE_HOME is an absolute path, else
// $HOME/.local/state/tide/reports; nullopt when neither is set.
std::optional<std::filesystem::path> default_report_directory();

// Creates `dir` (private to the user where tide creates it) and removes the oldest of its
// reports beyond keep - 1, each with its traces: files named tide-report.<pid>.json and
// tide-report.<pid>.*.json that are regular files. Returns the report pattern
// "<dir>/tide-report.%p.json". Throws std::filesystem::filesystem_error if `dir` cannot be made.
std::string prepare_report_directory(const std::filesystem::path& dir, std::size_t keep);

}  // namespace tide::tools
