#include "standin/timeline.h"

#include <thread>
#include <utility>

namespace tide::standin {

std::shared_ptr<Timeline> Timeline::start(bool blocking) {
  auto timeline = std::make_shared<Timeline>(blocking);
  // Detached: the worker owns a reference and leaves once closed and drained, so destroying a
  // stream never waits for its work (cuStreamDestroy returns at once, as in CUDA).
  std::thread([timeline] { timeline->run(); }).detach();
  return timeline;
}

Position Timeline::enqueue(std::vector<Position> deps, std::function<void()> work) {
  std::uint64_t seq = 0;
  {
    const std::lock_guard lock(mutex_);
    queue_.push_back(Item{std::move(deps), std::move(work)});
    seq = ++submitted_;
  }
  work_ready_.notify_one();
  return Position{shared_from_this(), seq};
}

Position Timeline::tail() {
  const std::lock_guard lock(mutex_);
  return Position{shared_from_this(), submitted_};
}

bool Timeline::reached(std::uint64_t seq) {
  const std::lock_guard lock(mutex_);
  return completed_ >= seq;
}

void Timeline::wait(std::uint64_t seq) {
  std::unique_lock lock(mutex_);
  progress_.wait(lock, [&] { return completed_ >= seq; });
}

bool Timeline::idle() {
  const std::lock_guard lock(mutex_);
  return completed_ == submitted_;
}

void Timeline::close() {
  {
    const std::lock_guard lock(mutex_);
    closing_ = true;
  }
  work_ready_.notify_one();
}

bool Timeline::closed_and_idle() {
  const std::lock_guard lock(mutex_);
  return closing_ && completed_ == submitted_;
}

void Timeline::run() {
  for (;;) {
    Item item;
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [&] { return !queue_.empty() || closing_; });
      if (queue_.empty()) return;  // closed and drained
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    for (const Position& dep : item.deps) dep.timeline->wait(dep.seq);
    if (item.work) item.work();
    // Release what the work captured before anyone learns it is done.
    item = Item{};
    {
      const std::lock_guard lock(mutex_);
      ++completed_;
    }
    progress_.notify_all();
  }
}

}  // namespace tide::standin
