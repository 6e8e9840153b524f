// The residency decision (planner/residency.h): who joins, who stays, who leaves, from the held
// memory, with a hysteresis band between joining and leaving.
#include "planner/residency.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace tide::planner {
namespace {

ResidencyInput input(std::vector<char> resident, std::uint64_t held, double hysteresis = 0.1) {
  ResidencyInput in;
  in.slot_bytes = {100, 100, 100, 100};
  in.allowed = {1, 1, 1, 1};
  in.resident = std::move(resident);
  in.held_bytes = held;
  in.working_bytes = 50;
  in.hysteresis = hysteresis;
  return in;
}

using Flags = std::vector<char>;

TEST(Residency, JoinsInIndexOrderUnderTheJoinLimit) {
  // 350 left after the working bytes; joining stops at 90% of it: 315, three slots.
  EXPECT_EQ(choose_resident(input({0, 0, 0, 0}, 400)), (Flags{1, 1, 1, 0}));
  EXPECT_EQ(choose_resident(input({0, 0, 0, 0}, 50)), (Flags{0, 0, 0, 0}));  // working only
  EXPECT_EQ(choose_resident(input({0, 0, 0, 0}, 0)), (Flags{0, 0, 0, 0}));
  EXPECT_EQ(choose_resident(input({0, 0, 0, 0}, 1000)), (Flags{1, 1, 1, 1}));
}

TEST(Residency, StaysWithinTheBandAndLeavesFromTheEnd) {
  // Three resident; 340 left: under the keep limit, though over the join limit (306).
  EXPECT_EQ(choose_resident(input({1, 1, 1, 0}, 390)), (Flags{1, 1, 1, 0}));
  // 299 left: the third no longer fits, the last ones leave first.
  EXPECT_EQ(choose_resident(input({1, 1, 1, 0}, 349)), (Flags{1, 1, 0, 0}));
  // Two resident, a forecast in the band: none joins (no churn).
  EXPECT_EQ(choose_resident(input({1, 1, 0, 0}, 380)), (Flags{1, 1, 0, 0}));
  // Enough room: they join.
  EXPECT_EQ(choose_resident(input({1, 1, 0, 0}, 500)), (Flags{1, 1, 1, 1}));
}

TEST(Residency, ResidentOnesKeepTheirPlaceBeforeOthersJoin) {
  // Subgroup 3 is resident: it stays, and the room left takes 0 and 1 (250 < 0.9 * 350).
  EXPECT_EQ(choose_resident(input({0, 0, 0, 1}, 400)), (Flags{1, 1, 0, 1}));
}

TEST(Residency, SubgroupsNotAllowedNeverJoinAndLeave) {
  ResidencyInput in = input({1, 1, 0, 0}, 1000);
  in.allowed = {1, 0, 1, 1};
  EXPECT_EQ(choose_resident(in), (Flags{1, 0, 1, 1}));
}

TEST(Residency, RejectsMismatchedInputs) {
  ResidencyInput in = input({1, 1}, 1000);
  EXPECT_THROW(choose_resident(in), std::invalid_argument);
  EXPECT_THROW(choose_resident(input({0, 0, 0, 0}, 1000, 1.0)), std::invalid_argument);
  EXPECT_THROW(choose_resident(input({0, 0, 0, 0}, 1000, -0.1)), std::invalid_argument);
  EXPECT_EQ(resident_bytes({10, 20, 30}, {1, 0, 1}), 40u);
}

}  // namespace
}  // namespace tide::planner
