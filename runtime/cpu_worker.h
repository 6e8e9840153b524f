// The CPU side of an update phase: a thread that updates subgroups in place, one after another
// in the order they are handed to it, on the CPU thread pool, while the phase's coordinating
// thread drives the GPU side. Each finished subgroup is reported back (take()) with a wakeup. In a
// rank that shares its node (LOCAL_WORLD_SIZE > 1) the thread runs on the rank's share of the
// cores, as the pool's workers do.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/wakeup.h"

namespace tide::runtime {

class CpuWorker {
 public:
  struct Done {
    std::size_t subgroup = 0;
    std::chrono::steady_clock::time_point start, end;  // of its update
    double seconds = 0;
    std::uint64_t nonfinite = 0;
    std::string error;  // non-empty: the update threw, nothing was written
  };
  // Updates one subgroup; returns its non-finite count.
  using Update = std::function<std::uint64_t(std::size_t)>;

  CpuWorker(Update update, std::shared_ptr<Wakeup> wakeup);
  ~CpuWorker();  // finishes what it was given, then joins
  CpuWorker(const CpuWorker&) = delete;
  CpuWorker& operator=(const CpuWorker&) = delete;

  // Queues a subgroup (std::bad_alloc aside, never throws).
  void add(std::size_t subgroup);
  // No more subgroups will come.
  void close();
  // The subgroups finished since the last call.
  std::vector<Done> take();
  // Closed, every subgroup finished, and all of them taken.
  bool finished();

 private:
  void work();

  Update update_;
  std::shared_ptr<Wakeup> wakeup_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::deque<std::size_t> queue_;
  std::vector<Done> done_;
  bool closed_ = false;
  bool busy_ = false;
  std::thread thread_;
};

}  // namespace tide::runtime
