// How local ranks split a node's cores (config/node.h), on fake topologies: the split is a pure
// function of the topology, so machines this project never runs on are checked here.
#include "config/node.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "config/env.h"

namespace tide::config {
namespace {

std::vector<int> range(int first, int count) {
  std::vector<int> v;
  v.reserve(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) v.push_back(first + i);
  return v;
}

Topology nodes(std::vector<std::vector<int>> cpus) {
  Topology t;
  t.nodes.reserve(cpus.size());
  for (std::size_t i = 0; i < cpus.size(); ++i) t.nodes.push_back({static_cast<int>(i), cpus[i]});
  return t;
}

std::vector<CoreShare> split(const Topology& t, int ranks, const std::vector<int>& gpu_nodes = {}) {
  std::vector<CoreShare> out;
  out.reserve(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) out.push_back(core_share(t, {r, ranks}, gpu_nodes));
  return out;
}

// Disjoint, on one NUMA node each, and covering every core of the nodes that got ranks.
void expect_partition(const Topology& t, const std::vector<CoreShare>& shares) {
  std::set<int> seen;
  for (const CoreShare& s : shares) {
    ASSERT_FALSE(s.cpus.empty());
    EXPECT_FALSE(s.shared);
    const auto node = std::find_if(t.nodes.begin(), t.nodes.end(),
                                   [&](const NumaNode& n) { return n.id == s.numa_node; });
    ASSERT_NE(node, t.nodes.end());
    for (int c : s.cpus) {
      EXPECT_TRUE(seen.insert(c).second) << "core " << c << " given twice";
      EXPECT_TRUE(std::count(node->cpus.begin(), node->cpus.end(), c)) << c;
    }
  }
}

TEST(CoreShareTest, OneNodeTwoCoresTwoRanks) {
  const Topology t = nodes({{0, 1}});
  const auto s = split(t, 2);
  EXPECT_EQ(s[0].cpus, std::vector<int>{0});
  EXPECT_EQ(s[1].cpus, std::vector<int>{1});
  expect_partition(t, s);
}

TEST(CoreShareTest, OneRankAloneGetsEveryCore) {
  const CoreShare s = core_share(nodes({range(0, 6)}), {0, 1});
  EXPECT_EQ(s.cpus, range(0, 6));
  EXPECT_EQ(s.numa_node, 0);
  // Alone on two NUMA nodes: both, on no one node.
  const CoreShare both = core_share(nodes({range(0, 4), range(4, 4)}), {0, 1});
  EXPECT_EQ(both.cpus, range(0, 8));
  EXPECT_EQ(both.numa_node, -1);
}

TEST(CoreShareTest, TwoNumaNodesSpreadRanksInOrder) {
  const Topology t = nodes({range(0, 8), range(8, 8)});
  auto s = split(t, 2);
  EXPECT_EQ(s[0].numa_node, 0);
  EXPECT_EQ(s[0].cpus, range(0, 8));
  EXPECT_EQ(s[1].numa_node, 1);
  EXPECT_EQ(s[1].cpus, range(8, 8));
  s = split(t, 4);
  EXPECT_EQ(s[0].cpus, range(0, 4));
  EXPECT_EQ(s[1].cpus, range(4, 4));
  EXPECT_EQ(s[2].cpus, range(8, 4));
  EXPECT_EQ(s[3].cpus, range(12, 4));
  expect_partition(t, s);
  // Uneven: 3 ranks on 2 nodes of 8; the node with two ranks splits 4 + 4.
  s = split(t, 3);
  expect_partition(t, s);
  EXPECT_EQ(s[0].cpus.size() + s[1].cpus.size() + s[2].cpus.size(), 16u);
}

TEST(CoreShareTest, GpuNumaNodesPlaceRanks) {
  const Topology t = nodes({range(0, 4), range(4, 4)});
  // Ranks 0 and 1 drive GPUs on node 1, ranks 2 and 3 on node 0.
  const auto s = split(t, 4, {1, 1, 0, 0});
  EXPECT_EQ(s[0].cpus, range(4, 2));
  EXPECT_EQ(s[1].cpus, range(6, 2));
  EXPECT_EQ(s[2].cpus, range(0, 2));
  EXPECT_EQ(s[3].cpus, range(2, 2));
  expect_partition(t, s);
  // A node the topology does not have: the GPU hints are ignored, ranks spread in order.
  EXPECT_EQ(split(t, 4, {1, 1, 0, 7}), split(t, 4));
  // Hints for some ranks only: ignored too.
  EXPECT_EQ(split(t, 4, {1, 1}), split(t, 4));
}

TEST(CoreShareTest, UnevenCoresGiveTheFirstRanksOneMore) {
  const Topology t = nodes({range(0, 5)});
  const auto s = split(t, 2);
  EXPECT_EQ(s[0].cpus, range(0, 3));
  EXPECT_EQ(s[1].cpus, range(3, 2));
}

TEST(CoreShareTest, MoreRanksThanCoresShareOneCoreEach) {
  const Topology t = nodes({{0, 1}});
  const auto s = split(t, 5);
  for (int r = 0; r < 5; ++r) {
    EXPECT_TRUE(s[static_cast<std::size_t>(r)].shared);
    EXPECT_EQ(s[static_cast<std::size_t>(r)].cpus, std::vector<int>{r % 2});
  }
}

TEST(CoreShareTest, ManyTopologiesArePartitioned) {
  for (int a = 1; a <= 9; ++a) {
    for (int b = 0; b <= 9; b += 3) {
      Topology t = b ? nodes({range(0, a), range(64, b)}) : nodes({range(0, a)});
      for (int ranks = 2; ranks <= static_cast<int>(t.cpu_count()); ++ranks) {
        SCOPED_TRACE(std::to_string(a) + "+" + std::to_string(b) + " cores, " +
                     std::to_string(ranks) + " ranks");
        expect_partition(t, split(t, ranks));
      }
    }
  }
}

TEST(CoreShareTest, RefusesNonsense) {
  EXPECT_THROW(core_share(Topology{}, {0, 1}), std::invalid_argument);
  EXPECT_THROW(core_share(nodes({{0}}), {2, 2}), std::invalid_argument);
}

TEST(CpuListTest, ParsesLinuxCpuLists) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("5"), std::vector<int>{5});
  EXPECT_TRUE(parse_cpu_list("").empty());
  for (const char* bad : {"3-1", "1,1", "a", "1,", "-1", "0-70000", "2,1", "1--2", " 1"}) {
    EXPECT_THROW(parse_cpu_list(bad), std::invalid_argument) << bad;
  }
}

TEST(TopologyTest, ReadsASysfsNodeFolder) {
  const auto dir =
      std::filesystem::path(::testing::TempDir()) / ("tide_node_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto write = [&](const std::string& node, const std::string& text) {
    std::filesystem::create_directories(dir / node);
    std::ofstream(dir / node / "cpulist") << text << "\n";
  };
  write("node0", "0-3");
  write("node1", "4-7");
  write("possible", "ignored");
  Topology t = read_topology(dir, range(0, 8));
  ASSERT_EQ(t.nodes.size(), 2u);
  EXPECT_EQ(t.nodes[1].id, 1);
  EXPECT_EQ(t.nodes[1].cpus, range(4, 4));
  // Affinity restricts: node 1 keeps CPU 5 only, node 0 none and is dropped.
  t = read_topology(dir, {5});
  ASSERT_EQ(t.nodes.size(), 1u);
  EXPECT_EQ(t.nodes[0].id, 1);
  // A broken file, or CPUs sysfs does not account for: one node of the allowed CPUs.
  write("node1", "garbage");
  t = read_topology(dir, range(0, 8));
  ASSERT_EQ(t.nodes.size(), 1u);
  EXPECT_EQ(t.nodes[0].cpus, range(0, 8));
  EXPECT_EQ(read_topology(dir / "absent", {0, 1}).nodes[0].cpus, (std::vector<int>{0, 1}));
  std::filesystem::remove_all(dir);
}

class LocalRanksTest : public ::testing::Test {
 protected:
  void TearDown() override {
    ::unsetenv("LOCAL_RANK");
    ::unsetenv("LOCAL_WORLD_SIZE");
    ::unsetenv("LOCAL_SIZE");
  }
  static void set(const char* rank, const char* size) {
    if (rank)
      ::setenv("LOCAL_RANK", rank, 1);
    else
      ::unsetenv("LOCAL_RANK");
    if (size)
      ::setenv("LOCAL_WORLD_SIZE", size, 1);
    else
      ::unsetenv("LOCAL_WORLD_SIZE");
  }
};

TEST_F(LocalRanksTest, ReadsTorchrunsVariablesStrictly) {
  set(nullptr, nullptr);
  EXPECT_EQ(local_ranks(), (LocalRanks{0, 1}));
  set("1", "4");
  EXPECT_EQ(local_ranks(), (LocalRanks{1, 4}));
  const std::vector<std::pair<const char*, const char*>> bad = {
      {"1", nullptr}, {nullptr, "2"}, {"2", "2"},    {"-1", "2"}, {"x", "2"},
      {"0", "0"},     {"0", "2.5"},   {"0", "5000"}, {"1", "1"}};
  for (const auto& [rank, size] : bad) {
    set(rank, size);
    try {
      local_ranks();
      ADD_FAILURE() << (rank ? rank : "unset") << "/" << (size ? size : "unset") << " accepted";
    } catch (const EnvError& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.find("LOCAL_RANK") != std::string::npos ||
                  what.find("LOCAL_WORLD_SIZE") != std::string::npos)
          << what;
    }
  }
}

// DeepSpeed's launcher sets LOCAL_RANK and LOCAL_SIZE, not LOCAL_WORLD_SIZE.
TEST_F(LocalRanksTest, TakesDeepSpeedsLocalSizeWhenLocalWorldSizeIsUnset) {
  set("1", nullptr);
  ::setenv("LOCAL_SIZE", "3", 1);
  EXPECT_EQ(local_ranks(), (LocalRanks{1, 3}));
  set("1", "3");  // both, the same: fine
  EXPECT_EQ(local_ranks(), (LocalRanks{1, 3}));
  for (const char* size : {"2", "x"}) {  // both, different; or not an integer
    set("1", std::string(size) == "x" ? nullptr : "3");
    ::setenv("LOCAL_SIZE", size, 1);
    try {
      local_ranks();
      ADD_FAILURE() << "LOCAL_SIZE=" << size << " accepted";
    } catch (const EnvError& e) {
      EXPECT_NE(std::string(e.what()).find("LOCAL_SIZE"), std::string::npos) << e.what();
    }
  }
  set("3", nullptr);  // LOCAL_RANK beyond LOCAL_SIZE - 1
  ::setenv("LOCAL_SIZE", "3", 1);
  EXPECT_THROW(local_ranks(), EnvError);
}

// The GPU's NUMA node from a sysfs PCI devices folder (a fake one here).
TEST(PciNumaNodeTest, ReadsTheDevicesNumaNode) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("tide_pci_node_" + std::to_string(getpid()));
  fs::remove_all(root);
  auto device = [&](const std::string& id, const std::string& text) {
    fs::create_directories(root / id);
    std::ofstream(root / id / "numa_node") << text;
  };
  device("0000:3b:00.0", "1\n");
  device("0000:5e:00.0", "-1\n");  // a machine without NUMA
  device("0000:af:00.0", "node one\n");
  device("0000:d8:00.0", "2");
  fs::create_directories(root / "0000:86:00.0");  // no numa_node file
  EXPECT_EQ(pci_numa_node(root, "0000:3b:00.0"), 1);
  EXPECT_EQ(pci_numa_node(root, "0000:3B:00.0"), 1);      // as CUDA writes it
  EXPECT_EQ(pci_numa_node(root, "00000000:3B:00.0"), 1);  // an 8-digit domain
  EXPECT_EQ(pci_numa_node(root, "0000:d8:00.0"), 2);
  EXPECT_EQ(pci_numa_node(root, "0000:5e:00.0"), -1);
  EXPECT_EQ(pci_numa_node(root, "0000:af:00.0"), -1);
  EXPECT_EQ(pci_numa_node(root, "0000:86:00.0"), -1);
  EXPECT_EQ(pci_numa_node(root, "0000:01:00.0"), -1);  // no such device
  EXPECT_EQ(pci_numa_node(root, ""), -1);
  EXPECT_EQ(pci_numa_node(root, "../0000:3b:00.0"), -1);  // not a bus id: never a path
  EXPECT_EQ(pci_numa_node(root / "missing", "0000:3b:00.0"), -1);
  fs::remove_all(root);
}

}  // namespace
}  // namespace tide::config
