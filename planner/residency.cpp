#include "planner/residency.h"

#include <stdexcept>

namespace tide::planner {

std::uint64_t resident_bytes(const std::vector<std::uint64_t>& slot_bytes,
                             const std::vector<char>& resident) {
  std::uint64_t bytes = 0;
  for (std::size_t s = 0; s < slot_bytes.size() && s < resident.size(); ++s) {
    if (resident[s] != 0) bytes += slot_bytes[s];
  }
  return bytes;
}

std::vector<char> choose_resident(const ResidencyInput& in) {
  const std::size_t n = in.slot_bytes.size();
  if (in.allowed.size() != n || in.resident.size() != n) {
    throw std::invalid_argument("tide: residency: one flag per subgroup is needed");
  }
  if (!(in.hysteresis >= 0 && in.hysteresis < 1)) {
    throw std::invalid_argument("tide: residency: hysteresis must be in [0, 1)");
  }
  std::vector<char> chosen(n, 0);
  if (in.held_bytes <= in.working_bytes) return chosen;
  const std::uint64_t keep_limit = in.held_bytes - in.working_bytes;
  const auto join_limit =
      static_cast<std::uint64_t>(static_cast<double>(keep_limit) * (1.0 - in.hysteresis));

  // Those resident now stay, in index order, while they fit under the keep limit.
  std::uint64_t bytes = 0;
  for (std::size_t s = 0; s < n; ++s) {
    if (in.resident[s] == 0 || in.allowed[s] == 0) continue;
    if (bytes + in.slot_bytes[s] > keep_limit) break;  // this one and the later ones leave
    bytes += in.slot_bytes[s];
    chosen[s] = 1;
  }
  // Others join in index order while all stay under the join limit.
  for (std::size_t s = 0; s < n; ++s) {
    if (chosen[s] != 0 || in.allowed[s] == 0) continue;
    if (bytes + in.slot_bytes[s] > join_limit) break;
    bytes += in.slot_bytes[s];
    chosen[s] = 1;
  }
  return chosen;
}

}  // namespace tide::planner
