// The CPU pool of one of two local ranks (LOCAL_RANK=1, LOCAL_WORLD_SIZE=2, set by ctest): sized
// to the rank's share of the node's cores and pinned there (TIDE_CPU_PIN=0: not pinned); a
// TIDE_CPU_THREADS above the share is an error naming it; the executor's CPU worker thread runs
// there too. One process: the pool is created once.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "config/env.h"
#include "config/node.h"
#include "driver/node_share.h"
#include "kernels/thread_pool.h"
#include "runtime/cpu_worker.h"

namespace tide::kernels {
namespace {

TEST(PoolShareTest, SizedAndPinnedToTheRanksShare) {
  const config::CoreShare& share = driver::this_core_share();
  const config::Topology topology = config::this_topology();
  EXPECT_EQ(share, config::core_share(topology, {1, 2}));
  if (topology.cpu_count() >= 2) {
    // The other rank's cores are not ours.
    const config::CoreShare other = config::core_share(topology, {0, 2});
    for (int c : other.cpus) EXPECT_EQ(std::count(share.cpus.begin(), share.cpus.end(), c), 0);
  }
  const auto cores = static_cast<unsigned>(share.cpus.size());
  ::setenv("TIDE_CPU_THREADS", std::to_string(cores + 1).c_str(), 1);
  try {
    cpu_pool_shape();
    FAIL() << "TIDE_CPU_THREADS above the rank's share was accepted";
  } catch (const config::EnvError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("TIDE_CPU_THREADS"), std::string::npos) << what;
    EXPECT_NE(what.find("LOCAL_WORLD_SIZE=2"), std::string::npos) << what;
  }
  ::setenv("TIDE_CPU_THREADS", "1", 1);
  EXPECT_EQ(cpu_pool_shape().threads, 1u);
  ::unsetenv("TIDE_CPU_THREADS");
  // TIDE_CPU_PIN=0: the share's size, not pinned; a bad value names the knob.
  ::setenv("TIDE_CPU_PIN", "0", 1);
  EXPECT_EQ(cpu_pool_shape().threads, cores);
  EXPECT_TRUE(cpu_pool_shape().cpus.empty());
  ::setenv("TIDE_CPU_PIN", "sometimes", 1);
  try {
    cpu_pool_shape();
    ADD_FAILURE() << "TIDE_CPU_PIN=sometimes was accepted";
  } catch (const config::EnvError& e) {
    EXPECT_NE(std::string(e.what()).find("TIDE_CPU_PIN"), std::string::npos) << e.what();
  }
  ::unsetenv("TIDE_CPU_PIN");
  const PoolShape shape = cpu_pool_shape();
  EXPECT_EQ(shape.threads, cores);
  EXPECT_EQ(shape.cpus, share.cpus);
  EXPECT_EQ(cpu_pool().size(), cores);
  EXPECT_EQ(cpu_pool().cpus(), share.cpus);
}

// The executor's CPU worker thread runs part 0 of every pool run: it is pinned there too.
TEST(PoolShareTest, TheExecutorsCpuWorkerRunsOnTheShare) {
  std::vector<int> seen;
  {
    runtime::CpuWorker worker(
        [&](std::size_t) {
          cpu_set_t set;
          CPU_ZERO(&set);
          EXPECT_EQ(pthread_getaffinity_np(pthread_self(), sizeof set, &set), 0);
          for (int c = 0; c < CPU_SETSIZE; ++c) {
            if (CPU_ISSET(c, &set)) seen.push_back(c);
          }
          return std::uint64_t{0};
        },
        std::make_shared<runtime::Wakeup>());
    worker.add(0);
    worker.close();
  }
  EXPECT_EQ(seen, driver::this_core_share().cpus);
}

}  // namespace
}  // namespace tide::kernels
