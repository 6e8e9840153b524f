// run_ranks: local ranks as forked processes (what tide calibrate --ranks and bench/node_update
// measure with): every rank runs, with or without torchrun's variables, the barrier holds each
// rank until all arrive, and a rank that fails is named with its message, without a hang.
#include "planner/rank_processes.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

namespace tide::planner {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

TEST(RankProcessesTest, EveryRankRunsWithItsLocalRank) {
  const auto out = run_ranks(3, true, [](int rank, const RankBarrier&) {
    return std::to_string(rank) + " " + std::getenv("LOCAL_RANK") + " " +
           std::getenv("LOCAL_WORLD_SIZE") + " " + std::to_string(::getpid() != 0);
  });
  ASSERT_EQ(out.size(), 3u);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(out[static_cast<std::size_t>(r)],
              std::to_string(r) + " " + std::to_string(r) + " 3 1");
  ::setenv("LOCAL_RANK", "0", 1);  // a rank that assumes it is alone sees neither
  const auto alone = run_ranks(1, false, [](int, const RankBarrier&) {
    return std::string(std::getenv("LOCAL_RANK") ? "set" : "unset");
  });
  ::unsetenv("LOCAL_RANK");
  EXPECT_EQ(alone.at(0), "unset");
}

// Rank 1 arrives 0.3 s late at each of two barriers: rank 0 leaves each barrier no earlier.
TEST(RankProcessesTest, TheBarrierWaitsForEveryRank) {
  const auto out = run_ranks(2, true, [](int rank, const RankBarrier& barrier) {
    std::string times;
    for (int i = 0; i < 2; ++i) {
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const double before = now();
      barrier();
      times += std::to_string(now() - before) + " ";
    }
    return times;
  });
  const double first = std::stod(out[0]);
  const double second = std::stod(out[0].substr(out[0].find(' ')));
  EXPECT_GE(first, 0.2) << out[0];
  EXPECT_GE(second, 0.2) << out[0];
}

TEST(RankProcessesTest, AFailingRankIsNamedAndReleasesTheOthers) {
  try {
    run_ranks(2, true, [](int rank, const RankBarrier& barrier) -> std::string {
      if (rank == 1) throw std::runtime_error("no device here");
      barrier();  // rank 1 never arrives: its exit lets rank 0 go
      return "ok";
    });
    FAIL() << "a failing rank was not reported";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "rank 1: no device here");
  }
}

}  // namespace
}  // namespace tide::planner
