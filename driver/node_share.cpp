#include "driver/node_share.h"

#include <array>

#include "driver/cuda_api.h"
#include "driver/error.h"

namespace tide::driver {

std::vector<int> local_gpu_numa_nodes(config::LocalRanks ranks,
                                      const std::filesystem::path& pci_devices) {
  const CudaApi& cu = cuda();
  if (cu.cuDeviceGetPCIBusId == nullptr) return {};
  int count = 0;
  TIDE_CU(cuDeviceGetCount, &count);
  if (count < ranks.size) return {};
  std::vector<int> nodes;
  for (int r = 0; r < ranks.size; ++r) {
    CUdevice device = 0;
    TIDE_CU(cuDeviceGet, &device, r);
    std::array<char, 64> bus_id{};
    TIDE_CU(cuDeviceGetPCIBusId, bus_id.data(), static_cast<int>(bus_id.size()), device);
    const int node = config::pci_numa_node(pci_devices, bus_id.data());
    if (node < 0) return {};
    nodes.push_back(node);
  }
  return nodes;
}

config::CoreShare node_core_share(const config::Topology& topology, config::LocalRanks ranks,
                                  const std::filesystem::path& pci_devices) {
  std::vector<int> gpu_nodes;
  if (ranks.size > 1 && topology.nodes.size() > 1) {
    try {
      gpu_nodes = local_gpu_numa_nodes(ranks, pci_devices);
    } catch (...) {
      gpu_nodes.clear();  // no driver, or it failed: ranks go to nodes in order
    }
  }
  return config::core_share(topology, ranks, gpu_nodes);
}

const config::CoreShare& this_core_share() {
  static const config::CoreShare share =
      node_core_share(config::this_topology(), config::local_ranks());
  return share;
}

}  // namespace tide::driver
