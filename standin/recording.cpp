#include "standin/recording.h"

#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <new>
#include <vector>

namespace tide::standin {
namespace {

static_assert(sizeof(tide_standin_op) == 96, "standin.h gives TIDE_STANDIN_RECORD_MAX in bytes");

struct Recording {
  std::mutex mutex;
  std::atomic<bool> on{false};   // read without the lock on every submission
  std::uint64_t generation = 0;  // changes with every start and stop
  std::size_t capacity = 0;
  std::vector<tide_standin_op> ops;
  std::uint64_t dropped = 0;
};

Recording& recording() {
  static auto* r = new Recording;
  return *r;
}

// The steady clock: CLOCK_MONOTONIC on Linux, as std::chrono::steady_clock in the caller.
std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

RecordedOp record_submission(const tide_standin_op& op) {
  Recording& r = recording();
  RecordedOp out;
  if (!r.on.load(std::memory_order_relaxed)) return out;
  const std::lock_guard lock(r.mutex);
  if (r.capacity == 0) return out;
  if (r.ops.size() == r.capacity) {
    ++r.dropped;
    return out;
  }
  tide_standin_op& entry = r.ops.emplace_back(op);
  entry.submit_ns = now_ns();
  entry.start_ns = entry.end_ns = 0;
  out.generation_ = r.generation;
  out.index_ = r.ops.size() - 1;
  return out;
}

void RecordedOp::started() const {
  if (generation_ == 0) return;
  const std::int64_t t = now_ns();
  Recording& r = recording();
  const std::lock_guard lock(r.mutex);
  if (r.generation == generation_) r.ops[index_].start_ns = t;
}

void RecordedOp::ended() const {
  if (generation_ == 0) return;
  const std::int64_t t = now_ns();
  Recording& r = recording();
  const std::lock_guard lock(r.mutex);
  if (r.generation == generation_) r.ops[index_].end_ns = t;
}

int start_recording(std::size_t capacity) {
  if (capacity > TIDE_STANDIN_RECORD_MAX) return CUDA_ERROR_INVALID_VALUE;
  std::vector<tide_standin_op> ops;
  try {
    ops.reserve(capacity);
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Recording& r = recording();
  const std::lock_guard lock(r.mutex);
  ++r.generation;
  r.capacity = capacity;
  r.ops.swap(ops);  // the old entries go when `ops` does, after the lock
  r.dropped = 0;
  r.on.store(capacity != 0, std::memory_order_relaxed);
  return CUDA_SUCCESS;
}

void copy_recording(tide_standin_op* out, std::size_t max, std::size_t* recorded,
                    std::uint64_t* dropped) {
  Recording& r = recording();
  const std::lock_guard lock(r.mutex);
  if (out != nullptr) std::copy_n(r.ops.begin(), std::min(max, r.ops.size()), out);
  if (recorded != nullptr) *recorded = r.ops.size();
  if (dropped != nullptr) *dropped = r.dropped;
}

}  // namespace tide::standin
