// The thread pool, and the CPU Adam step on several threads and from several threads at once.
// Labelled `concurrency`: it also runs under TSan.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/cpu_adam.h"
#include "kernels/thread_pool.h"
#include "tests/kernels/adam_test_util.h"

namespace tide::kernels::testing {
namespace {

TEST(ThreadPoolTest, RunsEveryIndexOnceOnDistinctThreads) {
  ThreadPool pool(4);
  ASSERT_EQ(pool.size(), 4u);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::atomic<int>> hits(4);
    std::vector<std::thread::id> ids(4);
    pool.run(4, [&](unsigned i) {
      hits[i].fetch_add(1);
      ids[i] = std::this_thread::get_id();
    });
    for (unsigned i = 0; i < 4; ++i) EXPECT_EQ(hits[i].load(), 1);
    EXPECT_EQ(ids[0], std::this_thread::get_id());  // index 0 is the caller
    for (unsigned i = 1; i < 4; ++i) EXPECT_NE(ids[i], ids[0]);
  }
  std::atomic<int> calls{0};
  pool.run(99, [&](unsigned) { calls.fetch_add(1); });  // clamped to the pool's size
  EXPECT_EQ(calls.load(), 4);
  pool.run(0, [&](unsigned i) { EXPECT_EQ(i, 0u); });  // at least one
}

TEST(ThreadPoolTest, NestedRunsExecuteInline) {
  ThreadPool pool(3);
  std::atomic<int> inner{0};
  pool.run(3, [&](unsigned) { pool.run(3, [&](unsigned) { inner.fetch_add(1); }); });
  EXPECT_EQ(inner.load(), 9);
}

TEST(ThreadPoolTest, RethrowsATasksException) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.run(2,
                        [](unsigned i) {
                          if (i == 1) throw std::runtime_error("worker failed");
                        }),
               std::runtime_error);
  // And stays usable.
  std::atomic<int> calls{0};
  pool.run(2, [&](unsigned) { calls.fetch_add(1); });
  EXPECT_EQ(calls.load(), 2);
}

TEST(ThreadPoolTest, CallersFromManyThreadsTakeTurns) {
  ThreadPool pool(2);
  std::atomic<int> total{0};
  std::vector<std::thread> callers;
  callers.reserve(4);
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int round = 0; round < 100; ++round) {
        pool.run(2, [&](unsigned) { total.fetch_add(1); });
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(total.load(), 4 * 100 * 2);
}

// A pool given cores runs its workers there only (a local rank's share of the node).
TEST(ThreadPoolTest, WorkersRunOnTheGivenCores) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  int first = 0;
  while (!CPU_ISSET(first, &allowed)) ++first;
  ThreadPool pool(3, {first});
  std::vector<int> counts(3, -1);
  std::vector<int> on_first(3, 0);
  pool.run(3, [&](unsigned i) {
    cpu_set_t set;
    CPU_ZERO(&set);
    ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof set, &set), 0);
    counts[i] = CPU_COUNT(&set);
    on_first[i] = CPU_ISSET(first, &set) ? 1 : 0;
  });
  for (unsigned i = 1; i < 3; ++i) {
    EXPECT_EQ(counts[i], 1) << "worker " << i;
    EXPECT_EQ(on_first[i], 1) << "worker " << i;
  }
  // The calling thread is the caller's: left as it was.
  EXPECT_EQ(counts[0], CPU_COUNT(&allowed));
}

TEST(ThreadPoolTest, DefaultSizeIsTheCpusThisProcessMayUse) {
  EXPECT_GE(affinity_cpu_count(), 1u);
  EXPECT_LE(affinity_cpu_count(), std::thread::hardware_concurrency());
}

// The threaded step computes exactly what one thread computes, over chunks and their edges.
TEST(CpuAdamThreadsTest, ThreadedStepEqualsSingleThreadedStep) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Layout layout{Dtype::kBFloat16, Dtype::kFloat32, Dtype::kBFloat16};
  const std::size_t n = (std::size_t{1} << 16) * 3 + 12345;  // several chunks and a ragged end
  std::mt19937_64 rng_a(seed), rng_b(seed);
  Subgroup a(n, layout, rng_a, 7);
  Subgroup b(n, layout, rng_b, 7);
  a.grad.set(70000, std::numeric_limits<float>::infinity());
  b.grad.set(70000, std::numeric_limits<float>::infinity());
  AdamHyper h;
  h.step = 10;
  h.weight_decay = 0.01;
  CpuAdamOptions one;
  one.threads = 1;
  CpuAdamOptions many;
  many.threads = 4;  // more than this machine may have: the pool clamps
  const Snapshot before = snapshot(a);
  const AdamResult ra = cpu_adam_step(a.view(), h, many);
  const AdamResult rb = cpu_adam_step(b.view(), h, one);
  EXPECT_EQ(ra.nonfinite, 1u);
  EXPECT_EQ(rb.nonfinite, 1u);
  EXPECT_EQ(a.param.bytes(n), b.param.bytes(n));
  EXPECT_EQ(a.exp_avg.bytes(n), b.exp_avg.bytes(n));
  EXPECT_EQ(a.exp_avg_sq.bytes(n), b.exp_avg_sq.bytes(n));
  EXPECT_EQ(a.copy.bytes(n), b.copy.bytes(n));
  std::vector<bool> rejected(n, false);
  rejected[70000] = true;
  expect_step(h, before, a, rejected);
  EXPECT_EQ(cpu_count_nonfinite(a.grad.data(), a.grad.dtype(), n, many), 1u);
}

// Several threads (e.g. the scheduler's CPU workers) step different subgroups at once.
TEST(CpuAdamThreadsTest, ConcurrentStepsOnDifferentSubgroups) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  constexpr int kCallers = 3;
  const std::size_t n = (std::size_t{1} << 16) * 2 + 99;
  std::vector<std::unique_ptr<Subgroup>> concurrent, serial;
  for (int c = 0; c < kCallers; ++c) {
    std::mt19937_64 rng_a(seed + c), rng_b(seed + c);
    const Layout layout{Dtype::kFloat32, c == 1 ? Dtype::kBFloat16 : Dtype::kFloat32,
                        Dtype::kFloat16};
    concurrent.push_back(std::make_unique<Subgroup>(n, layout, rng_a, c));
    serial.push_back(std::make_unique<Subgroup>(n, layout, rng_b, c));
  }
  AdamHyper h;
  h.step = 2;
  std::vector<std::thread> callers;
  callers.reserve(kCallers);
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int step = 0; step < 3; ++step) cpu_adam_step(concurrent[c]->view(), h);
    });
  }
  for (auto& t : callers) t.join();
  CpuAdamOptions one;
  one.threads = 1;
  for (int c = 0; c < kCallers; ++c) {
    for (int step = 0; step < 3; ++step) cpu_adam_step(serial[c]->view(), h, one);
    EXPECT_EQ(concurrent[c]->param.bytes(n), serial[c]->param.bytes(n));
    EXPECT_EQ(concurrent[c]->exp_avg_sq.bytes(n), serial[c]->exp_avg_sq.bytes(n));
    EXPECT_EQ(concurrent[c]->copy.bytes(n), serial[c]->copy.bytes(n));
  }
}

}  // namespace
}  // namespace tide::kernels::testing
