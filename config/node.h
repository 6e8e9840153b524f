// The node this process shares with the other ranks on its host: which local rank it is, the
// machine's cores by NUMA node, and the share of them this rank's CPU work runs on.
//
// torchrun (and most launchers) start one process per GPU on a host and say which with LOCAL_RANK
// and LOCAL_WORLD_SIZE. Without them the process is one rank alone and its share is every core
// it may run on. With them, ranks split the cores: disjoint sets, each inside one NUMA node when
// the ranks can be spread that way, so that a rank's CPU update and its pinned memory stay on one
// memory controller, and no rank starts a pool of threads sized for the whole machine.
#pragma once

#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

namespace tide::config {

inline constexpr int kMaxLocalRanks = 4096;

struct LocalRanks {
  int rank = 0;
  int size = 1;
  bool operator==(const LocalRanks&) const = default;
};

// LOCAL_RANK and LOCAL_WORLD_SIZE, both or neither (neither: one rank alone), each strictly an
// integer, 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE <= kMaxLocalRanks. LOCAL_SIZE (DeepSpeed's
// launcher) stands for LOCAL_WORLD_SIZE when that is unset, and must equal it when both are set.
// Throws EnvError naming the variable otherwise.
LocalRanks local_ranks();

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;  // ascending
};

struct Topology {
  std::vector<NumaNode> nodes;  // by id; none empty
  std::size_t cpu_count() const;
};

// A Linux cpulist ("0-3,8,10-11"): ascending, without repeats. Throws std::invalid_argument for
// anything else, or for a CPU number above 65535 (bounded: no input makes a huge list).
std::vector<int> parse_cpu_list(std::string_view text);

// The topology a sysfs node folder (/sys/devices/system/node) describes, restricted to `allowed`
// (ascending CPU numbers): nodes left without an allowed CPU are dropped; one node 0 holding
// `allowed` when the folder is missing, unreadable, or does not account for every allowed CPU.
Topology read_topology(const std::filesystem::path& node_dir, const std::vector<int>& allowed);

// This machine as this process sees it: /sys/devices/system/node/node*/cpulist, each restricted
// to the CPUs sched_getaffinity allows (nodes left without any dropped); one node 0 holding the
// allowed CPUs when sysfs says nothing usable.
Topology this_topology();

// The NUMA node of the PCI device `bus_id` ("0000:3B:00.0", as cuDeviceGetPCIBusId writes it:
// any case) from a sysfs PCI devices folder (/sys/bus/pci/devices): its numa_node file. -1 when
// unknown: no such device or file, a value that is not a node number (sysfs says -1 on machines
// without NUMA), or a bus id that is not one (only hex digits, ':' and '.', at most 32 bytes).
int pci_numa_node(const std::filesystem::path& pci_devices, std::string_view bus_id);

struct CoreShare {
  std::vector<int> cpus;  // the rank's cores, ascending, never empty
  int numa_node = -1;     // the NUMA node they all lie on; -1: a rank alone on several nodes
  bool shared = false;    // more local ranks than cores: these cores also serve other ranks
  bool operator==(const CoreShare&) const = default;
};

// The cores of local rank `ranks.rank`. A rank alone gets every core. Ranks go to NUMA nodes by
// their GPU's node when `gpu_numa_nodes` gives one for every local rank and each names a node of
// `topology`; otherwise in order, in proportion to the nodes' cores (ranks 0..R/2-1 on the first of
// two equal nodes). A node's cores are then split evenly, in order, between its ranks (the first
// ones get one more when they do not divide). More ranks on a node than it has cores: rank j there
// gets core j mod cores, `shared` set. Deterministic: every rank computes the same split on its
// own.
CoreShare core_share(const Topology& topology, LocalRanks ranks,
                     std::span<const int> gpu_numa_nodes = {});

// This process's share is driver::this_core_share() (driver/node_share.h): it asks the driver
// for the GPUs' NUMA nodes.

}  // namespace tide::config
