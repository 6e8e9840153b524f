// kernels/host/fiber.h: tasks run on their own stacks, suspend and resume in any order, keep their
// locals and floating-point control state, and fibers run task after task. Built twice: with the
// x86-64 switch (kernels_fiber_test) and with ucontext (kernels_fiber_ucontext_test, as on other
// architectures).
#include <gtest/gtest.h>

#include <cfenv>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/host/fiber.h"

namespace tide::kernels::host {
namespace {

constexpr std::size_t kStack = std::size_t{256} * 1024;

struct Counter {
  Fiber* fiber = nullptr;
  int rounds = 0;
  std::vector<int>* log = nullptr;
  int id = 0;
};

// Logs its id, suspends, `rounds` times; its locals must survive every suspension.
void counting_task(void* arg) {
  auto& c = *static_cast<Counter*>(arg);
  std::uint64_t local[16];
  for (int i = 0; i < 16; ++i) local[i] = static_cast<std::uint64_t>(c.id) * 1000 + i;
  for (int r = 0; r < c.rounds; ++r) {
    c.log->push_back(c.id * 100 + r);
    c.fiber->suspend();
    for (int i = 0; i < 16; ++i) {
      if (local[i] != static_cast<std::uint64_t>(c.id) * 1000 + i) c.log->push_back(-1);
    }
  }
}

TEST(FiberTest, TasksSuspendAndResumeInAnyOrderKeepingTheirLocals) {
  constexpr int kFibers = 5;
  std::vector<std::unique_ptr<Fiber>> fibers;
  std::vector<Counter> counters(kFibers);
  std::vector<int> log;
  for (int f = 0; f < kFibers; ++f) {
    fibers.push_back(std::make_unique<Fiber>(kStack));
    counters[f] = {fibers.back().get(), 3, &log, f};
    EXPECT_TRUE(fibers[f]->idle());
    EXPECT_FALSE(fibers[f]->start(&counting_task, &counters[f]));  // suspended in round 0
    EXPECT_FALSE(fibers[f]->idle());
  }
  // Resume in reverse order, round by round; the last resume of each returns true.
  for (int r = 1; r <= 3; ++r) {
    for (int f = kFibers - 1; f >= 0; --f) EXPECT_EQ(fibers[f]->resume(), r == 3);
  }
  std::vector<int> expected;
  for (int f = 0; f < kFibers; ++f) expected.push_back(f * 100);
  for (int r = 1; r < 3; ++r) {
    for (int f = kFibers - 1; f >= 0; --f) expected.push_back(f * 100 + r);
  }
  EXPECT_EQ(log, expected);
  for (const auto& fiber : fibers) EXPECT_TRUE(fiber->idle());
}

void add_one(void* arg) { ++*static_cast<int*>(arg); }

TEST(FiberTest, AFiberRunsTaskAfterTask) {
  Fiber fiber(kStack);
  int n = 0;
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(fiber.start(&add_one, &n));
  EXPECT_EQ(n, 10000);
}

// Uses about `depth` KiB of stack; returns the number of frames below the first.
int recurse(int depth) {
  volatile char page[1024];
  page[depth % 1024] = 1;
  if (depth == 0) return 0;
  return recurse(depth - 1) + page[depth % 1024];
}

void deep_task(void* arg) {
  int& depth = *static_cast<int*>(arg);
  depth = recurse(depth) + 1000000;
}

TEST(FiberTest, TheWholeStackIsUsable) {
  Fiber fiber(std::size_t{1} << 20);
  int depth = 600;  // KiB, of 1024
  ASSERT_TRUE(fiber.start(&deep_task, &depth));
  EXPECT_EQ(depth, 1000600);
  int again = 10;
  ASSERT_TRUE(fiber.start(&deep_task, &again));
  EXPECT_EQ(again, 1000010);
}

struct Abandoned {
  Fiber* fiber;
  bool resumed = false;
};

void abandoned_task(void* arg) {
  auto& a = *static_cast<Abandoned*>(arg);
  a.fiber->suspend();
  a.resumed = true;
}

TEST(FiberTest, DestroyingAFiberAbandonsItsSuspendedTask) {
  Abandoned a{nullptr};
  {
    Fiber fiber(kStack);
    a.fiber = &fiber;
    EXPECT_FALSE(fiber.start(&abandoned_task, &a));
  }
  EXPECT_FALSE(a.resumed);
  Fiber next(kStack);  // the process goes on with new fibers
  int n = 0;
  EXPECT_TRUE(next.start(&add_one, &n));
  EXPECT_EQ(n, 1);
}

struct Rounding {
  Fiber* fiber;
  int seen_at_start = -1;
  int seen_after_resume = -1;
};

void rounding_task(void* arg) {
  auto& r = *static_cast<Rounding*>(arg);
  r.seen_at_start = std::fegetround();
  std::fesetround(FE_TOWARDZERO);
  r.fiber->suspend();
  r.seen_after_resume = std::fegetround();
}

// The ABI makes the floating-point control state callee-saved: each side of a switch keeps its
// own. A fiber's task starts rounding to nearest, as the device does.
TEST(FiberTest, EachSideKeepsItsRoundingMode) {
  Fiber fiber(kStack);
  Rounding r{&fiber};
  ASSERT_EQ(std::fesetround(FE_UPWARD), 0);
  EXPECT_FALSE(fiber.start(&rounding_task, &r));
  EXPECT_EQ(std::fegetround(), FE_UPWARD);
  EXPECT_TRUE(fiber.resume());
  EXPECT_EQ(std::fegetround(), FE_UPWARD);
  std::fesetround(FE_TONEAREST);
  EXPECT_EQ(r.seen_after_resume, FE_TOWARDZERO);
#if !defined(TIDE_FIBER_UCONTEXT)
  EXPECT_EQ(r.seen_at_start, FE_TONEAREST);
#endif
}

}  // namespace
}  // namespace tide::kernels::host
