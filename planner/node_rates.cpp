#include "planner/node_rates.h"

#include <stdexcept>
#include <utility>

#include "config/node.h"

namespace tide::planner {

int measured_ranks_per_host(const ResolvedRates& resolved) {
  return resolved.calibration ? resolved.calibration->machine.ranks_per_host : kBuiltinRanksPerHost;
}

ResolvedRates share_for_node(ResolvedRates resolved, int ranks_per_node) {
  if (ranks_per_node < 1) throw std::invalid_argument("share_for_node: ranks_per_node < 1");
  const double scale = static_cast<double>(measured_ranks_per_host(resolved)) / ranks_per_node;
  for (RateKind kind : {RateKind::cpu_update, RateKind::cpu_update_contended, RateKind::host_memory,
                        RateKind::host_memory_contended}) {
    const RateSource source = resolved.source[static_cast<std::size_t>(kind)];
    if (source == RateSource::builtin || source == RateSource::calibration) {
      rate_of(resolved.rates, kind) *= scale;
    }
  }
  return resolved;
}

ResolvedRates resolve_node_rates() {
  ResolvedRates resolved = resolve_rates(std::nullopt);
  const int ranks = config::local_ranks().size;
  return ranks > 1 ? share_for_node(std::move(resolved), ranks) : resolved;
}

}  // namespace tide::planner
