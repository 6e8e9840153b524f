// What host memory this process can still take: the cgroup's limit less what the cgroup uses
// (v2: memory.max and memory.current; v1: memory.limit_in_bytes and memory.usage_in_bytes), the
// kernel's MemAvailable, and TIDE_HOST_MEMORY_LIMIT. Optimizer state larger than that is refused
// when it is made, with what is needed and what is there, instead of the kernel's OOM killer
// ending the job later.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "allocator/pinned/memory_error.h"

namespace tide::allocator::pinned {

struct HostBudget {
  std::optional<std::uint64_t> cgroup_limit;  // none: the cgroup has no limit (or no cgroup)
  std::uint64_t cgroup_usage = 0;
  std::optional<std::uint64_t> mem_available;  // /proc/meminfo's MemAvailable
  std::optional<std::uint64_t> knob_limit;     // TIDE_HOST_MEMORY_LIMIT

  // The least of what each source leaves; none when no source limits.
  std::optional<std::uint64_t> available() const;
  // Each source, in words: "the cgroup's limit 8.00 GiB with 7.50 GiB in use; MemAvailable 12.0
  // GiB".
  std::string describe() const;
};

// Read now, from `proc` and `cgroup_root` (the mount of the cgroup file systems), with
// TIDE_HOST_MEMORY_LIMIT (read once; throws config::EnvError for a bad value).
HostBudget host_budget(const std::filesystem::path& proc = "/proc",
                       const std::filesystem::path& cgroup_root = "/sys/fs/cgroup");

// Throws HostMemoryError when `bytes` more than `what` holds would exceed the budget, naming both
// and what to change.
void check_host_budget(std::uint64_t bytes, const std::string& what,
                       const HostBudget& budget = host_budget());

}  // namespace tide::allocator::pinned
