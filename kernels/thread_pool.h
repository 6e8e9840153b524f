// A small persistent pool of CPU threads for the CPU kernels.
//
// A CPU Adam step over a subgroup takes milliseconds and runs every iteration: spawning threads
// for each would cost more than the waits here. Workers sleep on a condition variable between
// calls.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tide::kernels {

class ThreadPool {
 public:
  // A pool of `threads` participants: the calling thread of run() and threads − 1 workers. The
  // workers run on `cpus` only when it is not empty (the calling thread is the caller's, left
  // as it is).
  explicit ThreadPool(unsigned threads, const std::vector<int>& cpus = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned size() const { return size_; }
  // The cores the workers run on; empty: not pinned.
  const std::vector<int>& cpus() const { return cpus_; }

  // Runs task(0), ..., task(n − 1) at the same time, task(0) on the calling thread, and returns
  // when all have returned (rethrowing the first exception one threw). n is clamped to
  // [1, size()]. Calls from different threads take turns; a call from inside a task, or from a
  // child process forked after the pool started (it has none of the workers), runs all n on
  // the calling thread.
  void run(unsigned n, const std::function<void(unsigned)>& task);

 private:
  void work(unsigned index);

  unsigned size_;
  std::vector<int> cpus_;
  int owner_pid_;    // the process whose workers these are
  std::mutex turn_;  // one run() at a time
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  std::uint64_t generation_ = 0;
  unsigned participants_ = 0;
  unsigned pending_ = 0;
  const std::function<void(unsigned)>* task_ = nullptr;
  std::exception_ptr error_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// Runs the calling thread on `cpus` only; empty: leaves it as it is. Best effort: a CPU taken away
// since the cores were chosen leaves the thread where the kernel puts it (slower, never wrong).
void pin_this_thread(const std::vector<int>& cpus);

// The CPUs this process may run on (sched_getaffinity), at least 1.
unsigned affinity_cpu_count();

// The process's pool for the CPU kernels, created on first use. With one local rank (no
// LOCAL_WORLD_SIZE, or 1): TIDE_CPU_THREADS threads, default affinity_cpu_count(). With several,
// the rank's share of the node's cores (driver::this_core_share()): as many threads as it has
// cores, the workers pinned to them (unless TIDE_CPU_PIN=0); an explicit TIDE_CPU_THREADS above
// the share is an error
// (ranks would oversubscribe the cores each other's updates run on). Throws config::EnvError for
// a bad TIDE_CPU_THREADS, LOCAL_RANK or LOCAL_WORLD_SIZE.
ThreadPool& cpu_pool();

// The pool's size and cores cpu_pool() uses (what it would be created with). Throws as it does.
struct PoolShape {
  unsigned threads = 1;
  std::vector<int> cpus;  // empty: not pinned
};
PoolShape cpu_pool_shape();
}  // namespace tide::kernels
