#include "tools/report_directory.h"

#include <algorithm>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "config/env.h"

namespace tide::tools {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kPrefix = "tide-report.";

// "<pid>" of a report named tide-report.<pid>.json; empty for any other name.
std::string report_pid(std::string_view name) {
  constexpr std::string_view kSuffix = ".json";
  if (name.size() <= kPrefix.size() + kSuffix.size() || !name.starts_with(kPrefix) ||
      !name.ends_with(kSuffix)) {
    return {};
  }
  const std::string_view pid =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  if (!std::all_of(pid.begin(), pid.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return {};
  }
  return std::string(pid);
}

bool is_regular_file(const fs::directory_entry& entry) {
  std::error_code error;
  return entry.symlink_status(error).type() == fs::file_type::regular && !error;
}

}  // namespace

std::optional<fs::path> default_report_directory() {
  if (auto state = config::env_text("XDG_STATE_HOME"); state && fs::path(*state).is_absolute()) {
    return fs::path(*state) / "tide" / "reports";
  }
  if (auto home = config::env_text("HOME")) {
    return fs::path(*home) / ".local" / "state" / "tide" / "reports";
  }
  return std::nullopt;
}

std::string prepare_report_directory(const fs::path& dir, std::size_t keep) {
  if (fs::create_directories(dir)) {
    fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace);
  }
  std::vector<std::pair<fs::file_time_type, std::string>> reports;  // (written, pid)
  std::vector<fs::path> files;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    if (!is_regular_file(entry)) continue;
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(kPrefix)) continue;
    files.push_back(entry.path());
    if (std::string pid = report_pid(name); !pid.empty()) {
      reports.emplace_back(entry.last_write_time(error), std::move(pid));
    }
  }
  if (keep > 0 && reports.size() >= keep) {
    std::sort(reports.begin(), reports.end());
    reports.resize(reports.size() - (keep - 1));  // the oldest
    for (const auto& [written, pid] : reports) {
      const std::string own = std::string(kPrefix) + pid + ".";
      for (const fs::path& file : files) {
        const std::string name = file.filename().string();
        if (name.starts_with(own) && name.ends_with(".json")) fs::remove(file, error);
      }
    }
  }
  return (dir / "tide-report.%p.json").string();
}

}  // namespace tide::tools
