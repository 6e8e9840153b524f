#include "standin/busy.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string_view>
#include <thread>

#include "standin/contexts.h"
#include "standin/holds.h"
#include "standin/recording.h"
#include "standin/standin.h"
#include "standin/streams.h"

namespace tide::standin {

CUresult enqueue_busy(CUstream handle, double seconds, const char* name) {
  // Bounded: no input keeps a stream (and whatever waits for it) busy for more than an hour.
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 3600) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> stream;
  if (CUresult r = resolve_stream(handle, DefaultStream::kLegacy, &stream); r != CUDA_SUCCESS) {
    return r;
  }
  tide_standin_op op{};
  op.kind = TIDE_STANDIN_OP_KERNEL;
  op.device = stream->context().device();
  op.stream = stream->id();
  std::string_view(name != nullptr ? name : "busy").copy(op.name, sizeof op.name - 1);
  const auto duration = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(seconds));
  stream->submit([duration, recorded = record_submission(op)] {
    pass_hold(TIDE_STANDIN_OP_KERNEL);
    recorded.started();
    // From when it starts, like a kernel: a late wake-up of the worker does not lengthen the
    // stream's next work (sleep_until, not sleep_for after the bookkeeping).
    std::this_thread::sleep_until(std::chrono::steady_clock::now() + duration);
    recorded.ended();
  });
  return CUDA_SUCCESS;
}

}  // namespace tide::standin
