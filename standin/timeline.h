// A timeline: the ordered work of one stream and the worker thread that runs it.
//
// Work runs in submission order, each item after the positions it depends on (in other timelines)
// have been reached. A position is "the nth item submitted to a timeline"; waiting for one blocks
// on a condition variable, never spins. Work only ever depends on work submitted before it, so
// waits cannot form a cycle.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace tide::standin {

class Timeline;

struct Position {
  std::shared_ptr<Timeline> timeline;
  std::uint64_t seq = 0;  // 0: before any work, always reached
};

class Timeline : public std::enable_shared_from_this<Timeline> {
 public:
  // Starts the worker thread; `blocking`: whether the stream synchronises with the legacy
  // default stream.
  static std::shared_ptr<Timeline> start(bool blocking);

  // Appends `work` (may be empty: a marker) to run after `deps`; returns its position.
  Position enqueue(std::vector<Position> deps, std::function<void()> work);
  // The position of the last work submitted so far.
  Position tail();
  bool reached(std::uint64_t seq);
  void wait(std::uint64_t seq);
  bool idle();  // all work submitted so far has run
  bool blocking() const { return blocking_; }

  // No more work will come: the worker runs what is queued, then exits.
  void close();
  bool closed_and_idle();

  explicit Timeline(bool blocking) : blocking_(blocking) {}

 private:
  struct Item {
    std::vector<Position> deps;
    std::function<void()> work;
  };
  void run();

  const bool blocking_;
  std::mutex mutex_;
  std::condition_variable work_ready_;  // the worker waits for items
  std::condition_variable progress_;    // waiters wait for `completed_`
  std::deque<Item> queue_;
  std::uint64_t submitted_ = 0;
  std::uint64_t completed_ = 0;
  bool closing_ = false;
};

}  // namespace tide::standin
