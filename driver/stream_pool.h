// Streams that live as long as the process, a pool per device, handed out round-robin.
//
// Others keep the streams tide works on: PyTorch's allocator, through record_stream, keeps the
// gradient offload's stream until the gradient tensor is freed, and tide's caching allocator keeps
// the stream each cached block was last used on. A stream destroyed under them is undefined
// behaviour in CUDA (on the first real GPU: "invalid device context" in PyTorch's allocator,
// CONTEXT_IS_DESTROYED and crashes in the next optimizer's step). So, like PyTorch's own pooled
// streams, these are never destroyed, and the pool keeps its share of the device's primary context
// for the process's life. Two holders may get the same stream once the pool has gone round: that
// only orders their work.
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

#include "driver/context.h"
#include "driver/stream.h"

namespace tide::driver {

class StreamPool {
 public:
  static constexpr std::size_t kStreams = 16;

  // The pool of `context`'s device, made on first use.
  static StreamPool& of(const PrimaryContext& context);

  // The next stream, round-robin (created in the pool's context on first use: no context needs
  // to be current). Thread-safe. Throws CudaError.
  const Stream& next();

  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

 private:
  explicit StreamPool(const PrimaryContext& context) : context_(context) {}

  PrimaryContext context_;
  std::mutex mutex_;
  std::size_t next_ = 0;         // once the pool is full
  std::vector<Stream> streams_;  // up to kStreams, then reused
};

}  // namespace tide::driver
