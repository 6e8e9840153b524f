#include "config/placement.h"

#include <charconv>

namespace tide::config {

std::optional<Placement> parse_placement(std::string_view text) {
  if (text == "auto") return Placement{Placement::Kind::automatic, 0};
  if (text == "cpu") return Placement{Placement::Kind::cpu, 0};
  if (text == "gpu") return Placement{Placement::Kind::gpu, 0};
  std::string_view digits = text;
  if (!digits.empty() && (digits[0] == 'k' || digits[0] == 'K')) digits.remove_prefix(1);
  std::size_t k = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), k);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() || k < 1 ||
      k > (std::size_t{1} << 30)) {
    return std::nullopt;
  }
  return Placement{Placement::Kind::interleave, k};
}

}  // namespace tide::config
