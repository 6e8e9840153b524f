// `tide env`: every TIDE_* variable, what it accepts and does, and its current value (marked
// when tide would refuse it).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "allocator/pinned/node_limit.h"

#include "config/bytes.h"
#include "config/env.h"
#include "config/knobs.h"
#include "config/node.h"
#include "tools/command.h"

namespace tide::tools {
namespace {

// "0-3,8" for {0, 1, 2, 3, 8}.
std::string cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

// This process's place on its node (config/node.h) and its share of the pinned memory cap: what a
// rank started here with the same environment would use. False when LOCAL_RANK, LOCAL_WORLD_SIZE
// or TIDE_NODE_PINNED_LIMIT is refused (said on stderr).
bool print_node() {
  try {
    const config::LocalRanks ranks = config::local_ranks();
    const config::Topology topology = config::this_topology();
    const config::CoreShare share = config::core_share(topology, ranks);
    const allocator::pinned::NodePinned pinned = allocator::pinned::node_pinned();
    std::printf(
        "node: local rank %d of %d (LOCAL_RANK, LOCAL_WORLD_SIZE or LOCAL_SIZE); CPU pool on cores "
        "%s of %zu "
        "(%zu NUMA node%s%s)%s; pinned memory: %s\n",
        ranks.rank, ranks.size, cpu_list(share.cpus).c_str(), topology.cpu_count(),
        topology.nodes.size(), topology.nodes.size() == 1 ? "" : "s",
        share.numa_node >= 0 ? (", on node " + std::to_string(share.numa_node)).c_str() : "",
        share.shared ? ", shared with other ranks: more ranks than cores" : "",
        pinned.node_limit_bytes == 0
            ? "no cap (TIDE_NODE_PINNED_LIMIT unset)"
            : (config::format_bytes(pinned.rank_limit_bytes) + " for this rank of the node's " +
               config::format_bytes(pinned.node_limit_bytes))
                  .c_str());
    return true;
  } catch (const config::EnvError& e) {
    std::fprintf(stderr, "tide env: %s\n", e.what());
    return false;
  }
}

}  // namespace

int env_command(int /*argc*/, char** /*argv*/) {
  int bad = 0;
  for (const auto& knob : config::knobs()) {
    const std::string name(knob.name);
    const auto value = config::env_text(name.c_str());
    std::string invalid;
    if (value && knob.check != nullptr) {
      try {
        knob.check(knob.name, *value);
      } catch (const config::EnvError&) {
        invalid = "   <- invalid: not what it accepts";
        ++bad;
      }
    }
    std::printf("%s=%s%s\n    accepts: %.*s\n    %.*s\n", name.c_str(),
                value ? value->c_str() : "(unset)", invalid.c_str(),
                static_cast<int>(knob.accepts.size()), knob.accepts.data(),
                static_cast<int>(knob.description.size()), knob.description.data());
  }
  if (!print_node()) ++bad;
  if (bad != 0) {
    std::fprintf(stderr, "tide env: %d variable%s set to a value tide refuses (marked above)\n",
                 bad, bad == 1 ? " is" : "s are");
    return 1;
  }
  return 0;
}

}  // namespace tide::tools
