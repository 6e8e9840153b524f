#include "allocator/pinned/host_budget.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <limits>
#include <sstream>
#include <string_view>
#include <vector>

#include "config/bytes.h"
#include "config/env.h"
#include "config/knobs.h"

namespace tide::allocator::pinned {
namespace {

std::optional<std::string> first_line(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

std::optional<std::uint64_t> number(std::string_view text) {
  while (!text.empty() && (text.back() == ' ' || text.back() == '\n')) text.remove_suffix(1);
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<std::uint64_t> read_number(const std::filesystem::path& path) {
  const std::optional<std::string> line = first_line(path);
  return line ? number(*line) : std::nullopt;
}

// This process's cgroup directories: v2's one ("0::/path") and v1's memory controller's
// ("N:memory:/path" or with other controllers listed beside it).
struct CgroupPaths {
  std::optional<std::string> v2, v1_memory;
};

CgroupPaths cgroup_paths(const std::filesystem::path& proc) {
  CgroupPaths out;
  std::ifstream in(proc / "self" / "cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t a = line.find(':');
    const std::size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (line.starts_with("0::")) {
      out.v2 = path;
    } else {
      std::stringstream list(controllers);
      std::string c;
      while (std::getline(list, c, ',')) {
        if (c == "memory") out.v1_memory = path;
      }
    }
  }
  return out;
}

// The cgroup's limit and usage: v2 first, else v1. A limit of "max" (v2) or a v1 limit near
// 2^63 (its "unlimited") is none.
void read_cgroup(const std::filesystem::path& proc, const std::filesystem::path& root,
                 HostBudget& budget) {
  const CgroupPaths paths = cgroup_paths(proc);
  auto under = [&](const std::filesystem::path& base, const std::string& path) {
    return base / std::filesystem::path(path).relative_path();
  };
  if (paths.v2) {
    const std::filesystem::path dir = under(root, *paths.v2);
    if (const auto limit = first_line(dir / "memory.max")) {
      budget.cgroup_limit = number(*limit);  // "max": none
      budget.cgroup_usage = read_number(dir / "memory.current").value_or(0);
      return;
    }
  }
  if (paths.v1_memory) {
    const std::filesystem::path dir = under(root / "memory", *paths.v1_memory);
    if (const auto limit = read_number(dir / "memory.limit_in_bytes")) {
      if (*limit < (std::uint64_t{1} << 62)) budget.cgroup_limit = *limit;
      budget.cgroup_usage = read_number(dir / "memory.usage_in_bytes").value_or(0);
    }
  }
}

std::optional<std::uint64_t> mem_available(const std::filesystem::path& proc) {
  std::ifstream in(proc / "meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("MemAvailable:")) continue;
    std::string_view rest = std::string_view(line).substr(13);
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    if (rest.ends_with(" kB")) rest.remove_suffix(3);
    if (const auto kib = number(rest)) return *kib * 1024;
  }
  return std::nullopt;
}

const std::optional<std::uint64_t>& knob_limit() {
  static const std::optional<std::uint64_t> limit =
      config::env_bytes("TIDE_HOST_MEMORY_LIMIT", 1, std::numeric_limits<std::uint64_t>::max(),
                        config::kLimitAccepts);
  return limit;
}

}  // namespace

std::optional<std::uint64_t> HostBudget::available() const {
  std::optional<std::uint64_t> least;
  auto take = [&](std::uint64_t v) { least = least ? std::min(*least, v) : v; };
  if (cgroup_limit) take(*cgroup_limit > cgroup_usage ? *cgroup_limit - cgroup_usage : 0);
  if (mem_available) take(*mem_available);
  if (knob_limit) take(*knob_limit);
  return least;
}

std::string HostBudget::describe() const {
  std::vector<std::string> parts;
  if (cgroup_limit) {
    const auto b = config::format_bytes_apart({*cgroup_limit, cgroup_usage});
    parts.push_back("the cgroup's limit " + b[0] + " with " + b[1] + " in use");
  }
  if (mem_available) parts.push_back("MemAvailable " + config::format_bytes(*mem_available));
  if (knob_limit) parts.push_back("TIDE_HOST_MEMORY_LIMIT=" + config::format_bytes(*knob_limit));
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out.empty() ? "no limit known" : out;
}

HostBudget host_budget(const std::filesystem::path& proc,
                       const std::filesystem::path& cgroup_root) {
  HostBudget budget;
  read_cgroup(proc, cgroup_root, budget);
  budget.mem_available = mem_available(proc);
  budget.knob_limit = knob_limit();
  return budget;
}

void check_host_budget(std::uint64_t bytes, const std::string& what, const HostBudget& budget) {
  const std::optional<std::uint64_t> available = budget.available();
  if (!available || bytes <= *available) return;
  const auto b = config::format_bytes_apart({bytes, *available});
  throw HostMemoryError("tide: " + what + " needs " + b[0] + " of host memory, and this process " +
                        "can take " + b[1] + " (" + budget.describe() +
                        "): use more ranks or nodes, 8-bit or bf16 moments (state_dtype), "
                        "or give the job more memory");
}

}  // namespace tide::allocator::pinned
