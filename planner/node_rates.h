// Rates for a rank that shares its node: the node's CPU update rate and host memory bandwidth are
// split between the ranks that update at once, the copy links and GPUs are each rank's own.
//
// A calibration records the ranks that ran while it measured (machine.ranks_per_host; the
// built-in rates assume kBuiltinRanksPerHost). Planning for another number of ranks per node
// scales the CPU update rates by measured/ranks: the update is bound by host memory bandwidth,
// which the node's ranks divide. Rates given explicitly (TIDE_RATE_*, tide plan's flags) are taken
// as per-rank rates of the node planned for, and left alone.
#pragma once

#include "planner/rate_sources.h"
#include "planner/rates.h"

namespace tide::planner {

inline constexpr int kBuiltinRanksPerHost = 4;

// The ranks per host `resolved`'s CPU rates were measured with.
int measured_ranks_per_host(const ResolvedRates& resolved);

// `resolved` with its built-in and calibrated CPU update and host memory rates shared out to
// `ranks_per_node` ranks (>= 1).
ResolvedRates share_for_node(ResolvedRates resolved, int ranks_per_node);

// resolve_rates(nullopt), shared out to this process's node when torchrun says it has company
// (LOCAL_WORLD_SIZE > 1; config::local_ranks()); as it is otherwise. What the executor plans with.
ResolvedRates resolve_node_rates();

}  // namespace tide::planner
