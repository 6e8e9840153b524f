// The NUMA node of each local rank's GPU, from the driver (the stand-in's two devices answer
// cuDeviceGetPCIBusId with buses 01 and 02) and a fake sysfs PCI devices folder: a rank's cores go
// to its GPU's node; when any GPU's node is unknown, ranks go to nodes in order.
#include "driver/node_share.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "driver/cuda_api.h"
#include "driver/error.h"

namespace tide::driver {
namespace {

namespace fs = std::filesystem;

// Two NUMA nodes of four CPUs each.
config::Topology two_nodes() {
  config::Topology t;
  t.nodes = {{0, {0, 1, 2, 3}}, {1, {4, 5, 6, 7}}};
  return t;
}

struct PciTree {
  PciTree() : root(fs::temp_directory_path() / ("tide_pci_" + std::to_string(getpid()))) {
    fs::remove_all(root);
    fs::create_directories(root);
  }
  ~PciTree() { fs::remove_all(root); }
  void device(const std::string& bus_id, const std::string& numa_node) const {
    fs::create_directories(root / bus_id);
    std::ofstream(root / bus_id / "numa_node") << numa_node << "\n";
  }
  fs::path root;
};

TEST(NodeShareTest, TheStandInAnswersPciBusIds) {
  std::array<char, 64> id{};
  TIDE_CU(cuDeviceGetPCIBusId, id.data(), static_cast<int>(id.size()), 0);
  EXPECT_STREQ(id.data(), "0000:01:00.0");
  TIDE_CU(cuDeviceGetPCIBusId, id.data(), static_cast<int>(id.size()), 1);
  EXPECT_STREQ(id.data(), "0000:02:00.0");
  EXPECT_EQ(cuda().cuDeviceGetPCIBusId(id.data(), 12, 0), CUDA_ERROR_INVALID_VALUE);  // too short
  EXPECT_EQ(cuda().cuDeviceGetPCIBusId(id.data(), 64, 7), CUDA_ERROR_INVALID_DEVICE);
}

TEST(NodeShareTest, RanksGoToTheirGpusNodes) {
  PciTree pci;
  pci.device("0000:01:00.0", "1");  // rank 0's GPU on node 1
  pci.device("0000:02:00.0", "0");
  EXPECT_EQ(local_gpu_numa_nodes({0, 2}, pci.root), (std::vector<int>{1, 0}));
  const config::CoreShare r0 = node_core_share(two_nodes(), {0, 2}, pci.root);
  const config::CoreShare r1 = node_core_share(two_nodes(), {1, 2}, pci.root);
  EXPECT_EQ(r0.numa_node, 1);
  EXPECT_EQ(r0.cpus, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(r1.numa_node, 0);
  EXPECT_EQ(r1.cpus, (std::vector<int>{0, 1, 2, 3}));
}

TEST(NodeShareTest, AnUnknownNodeFallsBackToOrder) {
  const config::CoreShare in_order = config::core_share(two_nodes(), {0, 2});
  ASSERT_EQ(in_order.numa_node, 0);
  {
    PciTree pci;
    pci.device("0000:01:00.0", "1");
    pci.device("0000:02:00.0", "-1");  // sysfs on a machine that does not know
    EXPECT_TRUE(local_gpu_numa_nodes({0, 2}, pci.root).empty());
    EXPECT_EQ(node_core_share(two_nodes(), {0, 2}, pci.root), in_order);
  }
  {
    PciTree pci;
    pci.device("0000:01:00.0", "1");  // the second GPU absent from sysfs
    EXPECT_EQ(node_core_share(two_nodes(), {0, 2}, pci.root), in_order);
  }
  {
    PciTree pci;
    pci.device("0000:01:00.0", "1");
    pci.device("0000:02:00.0", "0");
    // Three local ranks, two visible devices: which GPU rank 2 drives is not known.
    EXPECT_TRUE(local_gpu_numa_nodes({0, 3}, pci.root).empty());
    EXPECT_EQ(node_core_share(two_nodes(), {0, 3}, pci.root),
              config::core_share(two_nodes(), {0, 3}));
    // A node the topology does not have (say, a node without allowed CPUs): in order too.
    pci.device("0000:01:00.0", "3");
    EXPECT_EQ(node_core_share(two_nodes(), {0, 2}, pci.root), in_order);
  }
}

TEST(NodeShareTest, OneNodeOrOneRankNeedsNoGpuNode) {
  PciTree pci;
  pci.device("0000:01:00.0", "1");
  pci.device("0000:02:00.0", "0");
  config::Topology one;
  one.nodes = {{0, {0, 1, 2, 3}}};
  EXPECT_EQ(node_core_share(one, {0, 2}, pci.root), config::core_share(one, {0, 2}));
  EXPECT_EQ(node_core_share(two_nodes(), {0, 1}, pci.root).cpus.size(), 8u);  // alone: all
}

}  // namespace
}  // namespace tide::driver
