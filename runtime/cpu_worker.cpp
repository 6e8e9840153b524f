#include "runtime/cpu_worker.h"

#include <chrono>
#include <exception>
#include <utility>

#include "config/node.h"
#include "kernels/thread_pool.h"

namespace tide::runtime {
namespace {

// A rank that shares its node updates on its share of the cores, like the CPU pool's workers:
// this thread runs part 0 of every pool run it starts.
void pin_to_rank_share() noexcept {
  try {
    if (config::local_ranks().size > 1) kernels::pin_this_thread(kernels::cpu_pool().cpus());
  } catch (...) {
    // A bad LOCAL_* or TIDE_CPU_THREADS: the first update reports it.
  }
}

}  // namespace

CpuWorker::CpuWorker(Update update, std::shared_ptr<Wakeup> wakeup)
    : update_(std::move(update)), wakeup_(std::move(wakeup)), thread_([this] { work(); }) {}

CpuWorker::~CpuWorker() {
  close();
  thread_.join();
}

void CpuWorker::add(std::size_t subgroup) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(subgroup);
  }
  work_ready_.notify_one();
}

void CpuWorker::close() {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
  }
  work_ready_.notify_one();
}

std::vector<CpuWorker::Done> CpuWorker::take() {
  std::lock_guard lock(mutex_);
  return std::exchange(done_, {});
}

bool CpuWorker::finished() {
  std::lock_guard lock(mutex_);
  return closed_ && queue_.empty() && !busy_ && done_.empty();
}

void CpuWorker::work() {
  pin_to_rank_share();
  for (;;) {
    std::size_t subgroup = 0;
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [&] { return closed_ || !queue_.empty(); });
      if (queue_.empty()) return;  // closed
      subgroup = queue_.front();
      queue_.pop_front();
      busy_ = true;
    }
    Done done;
    done.subgroup = subgroup;
    done.start = std::chrono::steady_clock::now();
    try {
      done.nonfinite = update_(subgroup);
    } catch (const std::exception& e) {
      done.error = e.what();
    } catch (...) {
      done.error = "unknown error";
    }
    done.end = std::chrono::steady_clock::now();
    done.seconds = std::chrono::duration<double>(done.end - done.start).count();
    {
      std::lock_guard lock(mutex_);
      done_.push_back(std::move(done));
      busy_ = false;
    }
    wakeup_->notify();
  }
}

}  // namespace tide::runtime
