#include "driver/stream_pool.h"

#include <map>
#include <memory>

namespace tide::driver {

StreamPool& StreamPool::of(const PrimaryContext& context) {
  // Never destroyed: the streams outlive every holder, static destruction included.
  static auto* mutex = new std::mutex;
  static auto* pools = new std::map<int, std::unique_ptr<StreamPool>>;
  const std::lock_guard lock(*mutex);
  std::unique_ptr<StreamPool>& pool = (*pools)[context.device()];
  if (!pool) pool.reset(new StreamPool(context));
  return *pool;
}

const Stream& StreamPool::next() {
  const std::lock_guard lock(mutex_);
  if (streams_.size() < kStreams) {
    const ContextScope scope(context_);
    if (streams_.empty()) streams_.reserve(kStreams);  // never moves: holders keep references
    streams_.emplace_back();
    return streams_.back();
  }
  return streams_[next_++ % kStreams];
}

}  // namespace tide::driver
