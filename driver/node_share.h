// This process's share of its node's cores (config::core_share), with the NUMA node of each
// local rank's GPU from the driver: cuDeviceGetPCIBusId, then the device's numa_node in sysfs, so
// that a rank's cores and pinned chunks are on the node its GPU hangs off. Local rank r is taken
// to drive device r (torchrun's LOCAL_RANK convention, every GPU visible to every rank); when
// that cannot be known for every rank (fewer visible devices than local ranks, no driver, a
// device whose node sysfs does not say), ranks go to nodes in order, as config::core_share does
// without GPU nodes.
#pragma once

#include <filesystem>
#include <vector>

#include "config/node.h"

namespace tide::driver {

inline constexpr const char* kPciDevices = "/sys/bus/pci/devices";

// The NUMA node of local rank r's GPU (device r), for every local rank, read from `pci_devices`;
// empty when one is unknown. Loads the driver; throws what loading it throws.
std::vector<int> local_gpu_numa_nodes(config::LocalRanks ranks,
                                      const std::filesystem::path& pci_devices = kPciDevices);

// core_share(topology, ranks, gpu nodes): the GPUs' nodes are asked for only when they matter
// (several local ranks and several NUMA nodes), and a driver that cannot say leaves them out.
config::CoreShare node_core_share(const config::Topology& topology, config::LocalRanks ranks,
                                  const std::filesystem::path& pci_devices = kPciDevices);

// This process's: node_core_share(this_topology(), local_ranks()), computed once.
const config::CoreShare& this_core_share();

}  // namespace tide::driver
