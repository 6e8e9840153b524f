#include "kernels/thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "config/env.h"
#include "config/node.h"
#include "driver/node_share.h"

namespace tide::kernels {
namespace {

// The pool whose task this thread is running, if any: a nested run() must not wait for workers
// that are busy running the outer one.
thread_local const ThreadPool* running_in = nullptr;

struct RunningIn {
  explicit RunningIn(const ThreadPool* pool) : previous(running_in) { running_in = pool; }
  ~RunningIn() { running_in = previous; }
  RunningIn(const RunningIn&) = delete;
  RunningIn& operator=(const RunningIn&) = delete;
  const ThreadPool* previous;
};

}  // namespace

ThreadPool::ThreadPool(unsigned threads, const std::vector<int>& cpus)
    : size_(std::max(threads, 1u)), cpus_(cpus), owner_pid_(::getpid()) {
  workers_.reserve(size_ - 1);
  for (unsigned i = 1; i < size_; ++i) {
    workers_.emplace_back([this, i] {
      pin_this_thread(cpus_);
      work(i);
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    const std::lock_guard lock(mutex_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::run(unsigned n, const std::function<void(unsigned)>& task) {
  n = std::clamp(n, 1u, size_);
  if (n == 1 || running_in == this || ::getpid() != owner_pid_) {
    const RunningIn guard(this);
    for (unsigned i = 0; i < n; ++i) task(i);
    return;
  }
  const std::lock_guard turn(turn_);
  {
    const std::lock_guard lock(mutex_);
    task_ = &task;
    participants_ = n;
    pending_ = n - 1;
    error_ = nullptr;
    ++generation_;
  }
  start_.notify_all();
  std::exception_ptr mine;
  try {
    const RunningIn guard(this);
    task(0);
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock lock(mutex_);
  done_.wait(lock, [this] { return pending_ == 0; });
  task_ = nullptr;
  if (mine == nullptr) mine = error_;
  lock.unlock();
  if (mine != nullptr) std::rethrow_exception(mine);
}

void ThreadPool::work(unsigned index) {
  std::uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    start_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    // A run() cannot start the next generation before every participant of this one is done,
    // so a participant never misses its generation.
    if (index >= participants_) continue;
    const std::function<void(unsigned)>* task = task_;
    lock.unlock();
    std::exception_ptr error;
    try {
      const RunningIn guard(this);
      (*task)(index);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error != nullptr && error_ == nullptr) error_ = error;
    if (--pending_ == 0) done_.notify_one();
  }
}

void pin_this_thread(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  }
  (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

unsigned affinity_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    return std::max(std::thread::hardware_concurrency(), 1u);
  }
  return static_cast<unsigned>(std::max(CPU_COUNT(&set), 1));
}

PoolShape cpu_pool_shape() {
  const auto threads = config::env_int("TIDE_CPU_THREADS", 1, 1024);
  const config::LocalRanks ranks = config::local_ranks();
  if (ranks.size == 1) {
    return {threads ? static_cast<unsigned>(*threads) : affinity_cpu_count(), {}};
  }
  const config::CoreShare& share = driver::this_core_share();
  const auto cores = static_cast<unsigned>(share.cpus.size());
  if (threads && static_cast<unsigned>(*threads) > cores) {
    throw config::EnvError(
        "TIDE_CPU_THREADS", std::to_string(*threads),
        "an integer from 1 to " + std::to_string(cores) + ", the cores of local rank " +
            std::to_string(ranks.rank) +
            "'s share of the node (LOCAL_WORLD_SIZE=" + std::to_string(ranks.size) + ")");
  }
  // TIDE_CPU_PIN=0: the share's size, but the kernel places the threads (a machine shared with
  // other work, where a pinned rank cannot move off a core something else keeps busy).
  const bool pin = config::env_bool("TIDE_CPU_PIN").value_or(true);
  return {threads ? static_cast<unsigned>(*threads) : cores, pin ? share.cpus : std::vector<int>{}};
}

ThreadPool& cpu_pool() {
  // Never destroyed: joining at exit would wait on threads a forked child does not have, and
  // other static destructors (a driver's stream threads) may still run kernels.
  static ThreadPool* const pool = [] {
    const PoolShape shape = cpu_pool_shape();
    return new ThreadPool(shape.threads, shape.cpus);
  }();
  return *pool;
}

}  // namespace tide::kernels
